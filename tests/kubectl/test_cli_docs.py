"""docs/cli.md and `--help` tell the same story: every flag each command's `--help` lists is in
that command's table of docs/cli.md ("Flags of each command"), and every flag a table names is
one the command really takes. A flag added, renamed or dropped without its documentation (or
documentation of a flag that does not exist) fails here."""
from __future__ import annotations

import re
from pathlib import Path

import click
import pytest

from kubectl_gpudoctor import cli

DOC = Path(__file__).resolve().parents[2] / "docs" / "cli.md"
FLAG = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]*|-[a-zA-Z])(?![\w-])")
OPTION_LINE = re.compile(r"^  (-\S.*?)(?:\s{2,}|$)")
# a row that applies to some of its section's commands: "`pod` only: ...", "`install`: ..."
QUALIFIER = re.compile(r"^(`[a-z-]+`(, )?)+( only)?:")


def doc_sections() -> dict[str, set[str]]:
    """command path ("" for the group) -> the flags its table names (first column)."""
    text = DOC.read_text()
    body = text.split("### Flags of each command", 1)[1].split("\n## ", 1)[0]
    sections: dict[str, set[str]] = {}
    current = [""]
    for line in body.splitlines():
        if line.startswith("#### "):
            # "#### `node NODE` and `pod POD`" -> ["node", "pod"]; "`agent install`" stays two words
            current = [" ".join(w for w in c.split() if not w.isupper())
                       for c in re.findall(r"`([^`]+)`", line)]
            continue
        if line.startswith("| `"):
            cells = line.split(" | ")
            first, meaning = cells[0], " | ".join(cells[1:])
            only = QUALIFIER.match(meaning)  # "`pod` only: ..." / "`install`, `status`: ..."
            names = set(re.findall(r"`([a-z-]+)`", only.group(0))) if only else None
            for path in current:
                if names is None or path.split()[-1] in names:
                    sections.setdefault(path, set()).update(FLAG.findall(first))
    return sections


def help_flags(path: str) -> set[str]:
    """The flags `kubectl gpu-doctor PATH --help` prints (without -h/--help)."""
    cmd: click.Command = cli.cli
    ctx = click.Context(cli.cli, info_name="kubectl gpu-doctor")
    for word in path.split():
        cmd = cmd.commands[word]  # type: ignore[attr-defined]
        ctx = click.Context(cmd, info_name=word, parent=ctx)
    flags = set()
    for line in cmd.get_help(ctx).splitlines():
        m = OPTION_LINE.match(line)
        if m:
            flags.update(FLAG.findall(m.group(1)))
    return flags - {"-h", "--help"}


def commands(cmd: click.Command = cli.cli, path: str = ""):
    yield path
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from commands(sub, f"{path} {name}".strip())


COMMANDS = [p for p in commands() if p != "agent"]  # `agent` alone only groups its commands


def test_the_doc_has_a_table_for_every_command_and_no_other():
    assert set(doc_sections()) | {p for p in COMMANDS if not help_flags(p)} == set(COMMANDS)
    assert set(doc_sections()) <= set(COMMANDS)


@pytest.mark.parametrize("path", COMMANDS, ids=lambda p: p or "(before a command)")
def test_help_and_doc_name_the_same_flags(path):
    documented = doc_sections().get(path, set())
    shown = help_flags(path)
    assert shown - documented == set(), f"in `{path} --help` but not in docs/cli.md"
    assert documented - shown == set(), f"in docs/cli.md but `{path}` does not take it"


def test_the_parser_sees_real_flags():
    assert {"--kubeconfig", "-n", "--namespace", "--probe-namespace"} <= help_flags("pod")
    assert "-A" in help_flags("cleanup") and "--dry-run" in help_flags("agent install")
    assert "-n" not in help_flags("node")
