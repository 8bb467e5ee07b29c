"""The agent's watch mode (`python -m node_probe agent-watch`): look every interval, mark the node.

Why: the incidents the tool exists for come and go (the nvmlInit hang returns with each MIG
reconfiguration, device rules are rewritten seconds after a container starts, a thrashing node
recovers or dies). The watching agent runs the cheap checks on an interval, keeps one
NodeCondition per problem class on its own node (protocol/conditions.py), posts an Event at each
transition, keeps the full probe's evidence captured at the moment a problem starts, and can
expose metrics. Modules: detect (one pass of checks -> problems), state (hysteresis), writer
(the API server), ring and capture (evidence), metrics, loop (the process).
"""
