"""Fault scenarios with real processes, sockets, signals, filesystems and network namespaces.

Some faults need root (a tmpfs that fills up, network namespaces): those tests skip
elsewhere, but fail under ``CI=true``, where they must run.
"""

from __future__ import annotations

import os
import shutil

import pytest


def require_root(what: str) -> None:
    """Skip unless root (and the tools) are here; in CI, fail instead: a skipped fault test
    would pass unseen."""
    missing = [tool for tool in ("unshare", "ip", "mount") if shutil.which(tool) is None]
    problem = "needs root" if os.geteuid() != 0 else (f"needs {missing}" if missing else "")
    if problem:
        message = f"{what} {problem}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
