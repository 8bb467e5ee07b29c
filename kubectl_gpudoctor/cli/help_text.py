"""The help's words that are not a flag's: the `Examples:` block of every command, written as
kubectl writes its own (a comment line, then the command), kept in one place so the click
definitions in parser.py stay short."""
from __future__ import annotations


def examples(*pairs: str) -> str:
    """An `Examples:` block as kubectl's help has one: (comment, command) pairs, kept as
    written (click's \\b: not rewrapped)."""
    blocks = [f"\b\n  # {pairs[i]}\n  {pairs[i + 1]}" for i in range(0, len(pairs), 2)]
    return "\b\nExamples:\n" + "\n\n".join(b.removeprefix("\b\n") if i == 0 else b
                                          for i, b in enumerate(blocks)) + "\n"


EXAMPLES = {
    "": examples(
        "Why are the GPU pods on this node stuck? The verdict, then the evidence",
        "kubectl gpu-doctor node gpu-node-7",
        "Why is this pod Pending or failing, and what is wrong with its node",
        "kubectl gpu-doctor pod trainer-0 -n ml",
        "The sick GPU nodes of the fleet, worst first",
        "kubectl gpu-doctor nodes",
        "Which node holds up this multi-node job",
        "kubectl gpu-doctor job llama-train -n ml",
        "This host, over SSH on a node where no pod can start",
        "sudo kubectl-gpu_doctor local",
        "What a finding means and how to fix it (offline)",
        "kubectl gpu-doctor explain kubelet.admission_stalled"),
    "node": examples(
        "The verdict and the evidence of one node (by exec in its agent pod if one runs)",
        "kubectl gpu-doctor node gpu-node-7",
        "The API side only: no pod, no exec",
        "kubectl gpu-doctor node gpu-node-7 --no-probe",
        "For a ticket: keep the evidence, paste the answer",
        "kubectl gpu-doctor node gpu-node-7 --save incident.json -o markdown",
        "What the watching agent captured when the problem started",
        "kubectl gpu-doctor node gpu-node-7 --history"),
    "pod": examples(
        "Why this pod does not run, then its node (the checks focused on its containers)",
        "kubectl gpu-doctor pod trainer-0 -n ml",
        "A Pending GPU pod: its fit against every node, from three lists",
        "kubectl gpu-doctor pod trainer-0 -n ml --no-probe",
        "For a bot",
        "kubectl gpu-doctor pod pod/trainer-0 -n ml -o json"),
    "nodes": examples(
        "Every GPU node, the sick ones listed worst first",
        "kubectl gpu-doctor nodes",
        "A pool, every node listed, every column whole",
        "kubectl gpu-doctor nodes -l pool=h100 --show-healthy -o wide",
        "Also the node side of each (by exec where an agent runs, else a debug pod)",
        "kubectl gpu-doctor nodes -l pool=h100 --probe"),
    "job": examples(
        "Which node holds up this job? Its nodes and ranks compared (the API side)",
        "kubectl gpu-doctor job llama-train -n ml",
        "A name that is two kinds of job: say which",
        "kubectl gpu-doctor job llama-train -n ml --kind JobSet",
        "The pods of a selector as one job, the node side too (agents, else debug pods)",
        "kubectl gpu-doctor job -l app=trainer -n ml --probe",
        "For a bot",
        "kubectl gpu-doctor job llama-train -n ml -o json"),
    "local": examples(
        "This host (run it on the node, e.g. over SSH, where no pod can start)",
        "sudo kubectl-gpu_doctor local",
        "Only the device-plugin checks, no eBPF trace",
        "sudo kubectl-gpu_doctor local --only deviceplugin --trace-seconds 0",
        "A kernel log saved from another machine",
        "kubectl-gpu_doctor local --kmsg-file dmesg.txt --only kmsg",
        "Why is it slow, from what a ticket pasted (no GPU, no cluster needed)",
        "kubectl-gpu_doctor local --host-root /tmp/empty --bug-report nvidia-bug-report.log.gz"),
    "cleanup": examples(
        "Leftover debug pods in the probe namespace",
        "kubectl gpu-doctor cleanup",
        "In every namespace",
        "kubectl gpu-doctor cleanup -A"),
    "agent": examples(
        "Install the watching agent on every node (before the next incident)",
        "kubectl gpu-doctor agent install",
        "Which nodes it covers",
        "kubectl gpu-doctor agent status"),
    "agent install": examples(
        "The watching agent on every node",
        "kubectl gpu-doctor agent install",
        "Only on GPU nodes, as manifests for GitOps",
        "kubectl gpu-doctor agent install --node-selector nvidia.com/gpu.present=true "
        "--dry-run=client -o yaml",
        "The sleeping agent (exec only, no node status writes)",
        "kubectl gpu-doctor agent install --no-watch"),
    "agent status": examples(
        "Nodes without a Running agent, and version skew",
        "kubectl gpu-doctor agent status",
        "Every node, for a script",
        "kubectl gpu-doctor agent status -o json"),
    "agent uninstall": examples(
        "Remove the agent (the namespace stays)",
        "kubectl gpu-doctor agent uninstall"),
    "replay": examples(
        "The report of a saved bundle, offline, with its exit code",
        "kubectl gpu-doctor replay incident.json",
        "For the ticket",
        "kubectl gpu-doctor replay incident.json -o markdown"),
    "explain": examples(
        "A finding's page",
        "kubectl gpu-doctor explain kubelet.admission_stalled",
        "The page behind one of the watching agent's NodeConditions or reasons",
        "kubectl gpu-doctor explain GpuDoctorDevicePluginStuck",
        "Every id with its meaning",
        "kubectl gpu-doctor explain"),
    "mcp": examples(
        "Serve an incident assistant over stdio: API reads only, nothing created",
        "kubectl gpu-doctor mcp",
        "Also let its tools run the node probe (exec in the agent, else a debug pod)",
        "kubectl gpu-doctor mcp --allow-node-probe --call-timeout 2m"),
    "version": examples(
        "The plugin version and the probe image it launches",
        "kubectl gpu-doctor version",
        "For a script",
        "kubectl gpu-doctor version -o json"),
    "rbac": examples(
        "The probe namespace and the users' RBAC",
        "kubectl gpu-doctor rbac | kubectl apply -f -",
        "The base and the admission policy, to review first (opt-ins only when named)",
        "kubectl gpu-doctor rbac all > gpu-doctor-rbac.yaml"),
    "completion": examples(
        "bash completion for the kubectl-gpu_doctor executable",
        "source <(kubectl-gpu_doctor completion bash)"),
}
