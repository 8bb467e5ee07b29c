"""Is it slow, and why: the client's answer for a pod that runs (issue 38).

The node probe's gpu.slow check (node_probe/checks/slow) judges the GPUs; here the pod's own
GPU's degradation leads the verdict for `pod Y` on a Running pod, with the lost bandwidth or
clock, the cause and the action (lead.py); a Running pod whose GPUs were looked at and are not
slowed is said to be healthy. Pure: findings and the target in, a Lead out; verdict.py turns
it into its Verdict.
"""
