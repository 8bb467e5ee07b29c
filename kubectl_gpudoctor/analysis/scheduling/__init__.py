"""Why is a GPU pod not scheduled? The node fit the way kube-scheduler filters (fit.py and its
parts: gpu_held, placement, fit_findings), the namespace's ResourceQuota (quota.py), the queue or
scheduler that holds the pod (schedulers.py: Kueue, Volcano, KAI, HAMi), DRA claims that are
never allocated (dra.py) and HAMi's scheduler/device-plugin annotations (hami.py).
"""
