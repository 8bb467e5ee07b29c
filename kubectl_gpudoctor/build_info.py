"""Which probe image this build of the plugin pulls by default: a tag, or a release digest.

Why: a tag can be moved by whoever can push to the registry; the privileged debug pod must run
exactly the image that was released with this plugin. `scripts/build-plugin.sh` bakes the digest
the release workflow pushed (GPU_DOCTOR_PROBE_IMAGE=<repo>:<tag>@sha256:<digest>) into
`_build_info.json` beside this module inside the frozen artifact. A source checkout has no such
file: it pulls `<repo>:<version>` and says that it is not pinned (`kubectl gpu-doctor version`).
"""
from __future__ import annotations

import dataclasses
import json
import re
import sys
from pathlib import Path

from node_probe.protocol.version import __version__

DEFAULT_IMAGE_REPO = "ghcr.io/gpu-doctor/gpu-doctor-probe"
BUILD_INFO_FILE = "_build_info.json"
# <registry/path>[:tag]@sha256:<64 hex>, as the release workflow records it
PINNED = re.compile(r"^(?P<repo>[a-z0-9][a-z0-9._/-]*(?::[0-9]+)?(?:/[a-z0-9._-]+)*)"
                    r"(?::(?P<tag>[\w][\w.-]{0,127}))?@(?P<digest>sha256:[a-f0-9]{64})$")


@dataclasses.dataclass(frozen=True)
class ProbeImage:
    reference: str       # what the debug pod's `image:` gets
    tag: str             # the human-readable tag (the release version)
    digest: str | None   # sha256:... when pinned by a release build, else None

    @property
    def pinned(self) -> bool:
        return self.digest is not None

    def describe(self) -> str:
        if self.digest:
            return f"probe image {self.reference}\n  tag {self.tag}, pinned by digest {self.digest}"
        return (f"probe image {self.reference}\n  tag only, not pinned by digest "
                "(a source build; release artifacts pin the image by digest)")


def parse_pinned(reference: str) -> ProbeImage:
    """A digest-pinned reference, or ValueError (a release must never fall back to a tag)."""
    m = PINNED.match(reference.strip())
    if not m:
        raise ValueError(f"not a digest-pinned image reference: {reference!r} "
                         "(want <repo>[:<tag>]@sha256:<64 hex digits>)")
    return ProbeImage(reference=reference.strip(), tag=m.group("tag") or __version__,
                      digest=m.group("digest"))


class BuildInfoError(ValueError):
    """The build's baked-in image reference is unreadable: the artifact is broken or altered."""


def probe_image(info_dir: Path | None = None) -> ProbeImage:
    """The default probe image of this build."""
    path = (info_dir or Path(__file__).resolve().parent) / BUILD_INFO_FILE
    try:
        doc = json.loads(path.read_bytes()[:4096])
        return parse_pinned(str(doc["probe_image"]))
    except FileNotFoundError:
        return ProbeImage(reference=f"{DEFAULT_IMAGE_REPO}:{__version__}", tag=__version__,
                          digest=None)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise BuildInfoError(f"{path}: {exc}") from None


def _default(info_dir: Path | None = None) -> ProbeImage:
    """The default image, or one line and exit 70 (internal error): a release artifact whose pin
    cannot be read must not silently fall back to a movable tag for a privileged pod."""
    try:
        return probe_image(info_dir)
    except BuildInfoError as exc:
        print(f"kubectl gpu-doctor: error: this build of the plugin is broken ({exc}); "
              "reinstall it (kubectl krew reinstall gpu-doctor)", file=sys.stderr)
        raise SystemExit(70) from None


DEFAULT_PROBE_IMAGE = _default()
