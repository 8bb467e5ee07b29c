"""Readers of the host the probe runs on: /proc, files under --host-root (one safe open),
cgroups and device rules, kubelet files, NVIDIA devices and driver, and child processes with
deadlines. Nothing here decides a verdict; checks/ does."""
