"""What do other monitors and the watching agent already say about the node? Other health
monitors' conditions, taints and events (foreign.py); the agent's GpuDoctor conditions, read
once (agent_marks.py), for `node X` (agent_seen.py) and for `nodes` (agent_conditions.py).
"""
