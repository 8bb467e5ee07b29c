"""Can the node hand out what it has? GPUs in capacity vs allocatable (capacity.py), MIG
reconfiguration (mig.py), memory the pods' limits leave the node's daemons (memory.py, with the
kubelet's config: kubelet_config.py), and a fleet's pods folded into per-node tallies as they are
read (podfold.py).
"""
