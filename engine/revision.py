"""Which code is running: the git revision of this source tree, for records that must name it.

The terminal_divergence gate counts only explorer runs of the code that is running now
(``explorer_runs.revision``), so a run of an older checkout, a locally edited tree or a fabricated
(seeded) row never vouches for this one. Reads git once per process; decides nothing.
"""

from __future__ import annotations

import functools
import hashlib
import subprocess
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parent.parent
_GIT_TIMEOUT_S = 10


def _git(*args: str) -> subprocess.CompletedProcess[bytes] | None:
    try:
        return subprocess.run(
            ["git", "-C", str(_ROOT), *args], capture_output=True, timeout=_GIT_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def running_revision() -> str:
    """The commit this tree is at, with ``+dirty.<digest of the local edits>`` when tracked files
    differ from it; ``package-<version>`` outside a git checkout (an installed package)."""
    head = _git("rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        try:
            return f"package-{metadata.version('finality')}"
        except metadata.PackageNotFoundError:
            return "unknown"
    revision = head.stdout.decode().strip()
    diff = _git("diff", "HEAD", "--binary")
    if diff is not None and diff.returncode == 0 and diff.stdout:
        revision += "+dirty." + hashlib.sha256(diff.stdout).hexdigest()[:12]
    return revision


__all__ = [
    "running_revision",
]
