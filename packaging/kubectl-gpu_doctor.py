"""Entry script PyInstaller freezes into the `kubectl-gpu_doctor` executable (scripts/build-plugin.sh).

kubectl_gpudoctor.cli.entrypoint also dispatches the frozen executable's hidden re-entry
arguments (`__probe`, `__run_module`) used by `local` mode and by node_probe's child processes.
"""
from kubectl_gpudoctor.cli import entrypoint

if __name__ == "__main__":
    entrypoint()
