"""Offline input: what people paste into tickets, read into the records the live probe makes.

Why: "why is it slow" is asked of machines nobody can reach -- a customer's node, a closed
incident -- and what comes back is text: `nvidia-smi -q` (or its `-q -x` XML), `lspci -vvv`, an
`nvidia-bug-report.log(.gz)`. These modules read such files, bounded (bytes, decompressed bytes,
line length, XML depth and size), in one linear pass, into the shapes the NVML child and the
sysfs PCIe reader produce (node_probe/checks/slow's contract), so the same judges give the same
findings. A file none of them reads raises UnknownFormat with the formats the flag takes.
"""
from __future__ import annotations


class UnknownFormat(ValueError):
    """The file is not in a format the reader knows (the message names those it reads)."""
