"""Why do pods bound to the node never start? The kubelet admits nothing (admission.py), its
sync loop parked in a device-plugin call (goroutines.py over goroutine_dump.py), the wedge that
makes a debug pod pointless (wedge.py), a node that is NotReady or refuses the debug pod
(readiness.py).
"""
