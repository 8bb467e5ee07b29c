"""Entry script PyInstaller freezes into the `kubectl-gpu_doctor` executable (scripts/build-plugin.sh).

A frozen build has no `python -m`, so it re-enters itself for the node probe's children:
  kubectl-gpu_doctor __run_module MODULE ARGS...  (node_probe.host.subproc.python_module_argv: the
      NVML child, the cgroup access helper; kubectl_gpudoctor.api.pageparse.child_argv: the list-page
      parsers of `nodes`) -> runs MODULE as __main__ here;
  kubectl-gpu_doctor __probe ARGS...              (`local` mode) -> kubectl_gpudoctor.cli handles it.
Everything else goes to the click CLI.
"""
import runpy
import sys


def main() -> None:
    if len(sys.argv) >= 3 and sys.argv[1] == "__run_module":
        module = sys.argv[2]
        # only the probe's own helper modules, and the client's list-page parser
        if not module.startswith("node_probe.") and module != "kubectl_gpudoctor.api.pageparse":
            sys.exit(f"kubectl-gpu_doctor: refusing to run module {module!r}")
        sys.argv = [module, *sys.argv[3:]]
        runpy.run_module(module, run_name="__main__", alter_sys=True)
        sys.exit(0)
    from kubectl_gpudoctor.launch import entrypoint

    entrypoint()


if __name__ == "__main__":
    main()
