"""One module per user command: what `kubectl gpu-doctor <command>` does, from options to a verdict.

Why a package: cli/ parses the command line and maps errors to exit codes; the programs here
collect into the session and return an ExitStatus or raise a GpuDoctorError. They never call
sys.exit, never map an error to a code and never render: the report does that once at the end.
Imports run one way (docs/architecture.md): commands -> session -> reach -> report -> api ->
analysis -> base modules -> node_probe.protocol.
"""
