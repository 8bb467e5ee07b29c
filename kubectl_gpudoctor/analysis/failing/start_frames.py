"""Where in a container runtime's start error the NVIDIA hook's own words are, and which parts
the pod's author wrote.

Why: a start failure's message is the runtime's frame around text from several writers. The
container's command is one of them: runc reports a missing executable as `exec: "<argv[0]>":
executable file not found in $PATH` (opencontainers/runc#4713 quotes
`unable to start container process: exec: \\"/cluster/kube-apiserver-operator\\": executable
file not found in $PATH`), so a tenant whose command is the hook's error text makes the
runtime's message contain it (audit round 5, BH-01). The hook's error comes in its own frame,
its stderr after the runtime's `error running hook`:

- `error during container init: error running prestart hook #0: exit status 1, stdout: ,
  stderr: Auto-detected mode as 'legacy'\\nnvidia-container-cli: initialization error: ...`
  (runc 1.1+, NVIDIA/k8s-device-plugin#1431);
- `error during container init: error running hook #0: error running hook: exit status 1,
  stdout: , stderr: Auto-detected mode as 'legacy'\\nnvidia-container-cli: ...`
  (NVIDIA/nvidia-container-toolkit#131, #202);
- `container init caused: Running hook #1:: error running hook: exit status 1, stdout: ,
  stderr: Auto-detected mode as 'legacy'\\nnvidia-container-cli: device error: ...`
  (older runc through Docker, NVIDIA/nvidia-container-toolkit#29).

`runtime_text` blanks what the runtime quotes from the container's spec (the executable, the
working directory) so no pattern can match inside it; `hook_stderr` is the hook's stderr, one
line per line it wrote (the runtime's `\\n` escapes undone), and only there does
`nvidia-container-cli: ...` count. A message that is nothing but the hook's error (a quote cut
to it, nvidia-container-toolkit#2102) is the hook's too. Pure; linear in the message.
"""
from __future__ import annotations

import re

# what the runtime quotes from the pod's spec, with Go's %q (either plain or, once more
# escaped, inside containerd's own quoting): the executable and the working directory
_QUOTED_SPEC = re.compile(r'(?:exec: |chdir to cwd \()(\\?")((?:[^"\\]|\\.){0,8192}?)\1')
_HOOK = re.compile(r"(?:^|container init(?: caused)?: )(?:error running (?:[a-zA-Z]{1,20} )?hook "
                   r"#\d{1,3}: (?:error running hook: )?|Running hook #\d{1,3}:: error running "
                   r"hook: )exit status \d{1,3}, stdout: [^\n]{0,400}?, stderr: ")
_WHOLE = re.compile(r"^(?:Error: )?(?:stderr: )?(?:Auto-detected mode as '[a-z-]{1,20}'"
                    r"(?:\n|\\n))?(?=nvidia-container-cli)")


# an NVIDIA hook binary the runtime itself failed to exec, outside the container's own frame:
# `OCI runtime create failed: exec: "nvidia-container-runtime-hook": executable file not found
# in $PATH` (NVIDIA/nvidia-docker#958: the legacy prestart hook not installed)
_HOOK_BINARY = re.compile(r"(?:/[\w.+-]{1,64}){0,8}/?nvidia-(?:container-runtime-hook|ctk|"
                          r"cdi-hook|container-toolkit)")
# how the runtime frames the container's own process, just before its quoted argv[0]
_PROCESS_FRAME = ("container process: ", "container process caused: ",
                  'container process caused "', 'container process caused \\"')


def _blank(message: str, m: re.Match) -> str:
    before = message[max(0, m.start() - 40):m.start()]
    if (m.group(0).startswith("exec: ") and _HOOK_BINARY.fullmatch(m.group(2))
            and not before.endswith(_PROCESS_FRAME)):
        return m.group(0)   # the runtime's exec of a hook, not the pod's command
    return f'{m.group(0)[:m.start(1) - m.start(0)]}"<quoted>"'


def runtime_text(message: str) -> str:
    """The message with the container's own quoted command and working directory blanked (an
    NVIDIA hook binary the runtime execs outside the container's process frame is kept)."""
    return _QUOTED_SPEC.sub(lambda m: _blank(message, m), message)


def hook_stderr(text: str) -> str:
    """The NVIDIA hook's stderr in `text` (see runtime_text), its lines on lines of their own;
    "" when the message carries no hook frame."""
    m = _HOOK.search(text) or _WHOLE.search(text)
    if m is None:
        return ""
    return text[m.end():].replace("\\n", "\n")
