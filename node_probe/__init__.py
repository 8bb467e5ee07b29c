"""Node-side half of kubectl gpu-doctor: checks and eBPF probes that print gpu-doctor/v1 NDJSON.

Runs with only the stdlib, grpcio, pynvml and (optionally) bcc; never imports click,
kubernetes or kubectl_gpudoctor (DESIGN.md section 2).
"""
__version__ = "0.1.0"
