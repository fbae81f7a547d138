"""Result files between benchmark processes: written atomically, read only when complete.

A worker, node or agent of a benchmark reports by :func:`write_report`: the text goes to a
private temporary name and is renamed into place, so a file under its final name is always
whole. Readers wait for the names they expect (:func:`wait_reports`) and never read a
temporary (:func:`reports`), so no reader sees an empty or half-written file.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

TMP_SUFFIX = ".tmp"


def write_report(path: str | os.PathLike[str], text: str) -> None:
    """Write ``text`` to ``path`` atomically (a rename of a finished private file)."""
    final = os.fspath(path)
    tmp = f"{final}.{os.getpid()}{TMP_SUFFIX}"
    with open(tmp, "w") as fp:
        fp.write(text)
    os.replace(tmp, final)


def reports(folder: Path, pattern: str) -> list[Path]:
    """The finished reports in ``folder`` whose names match ``pattern`` (temporaries left
    out)."""
    return sorted(p for p in folder.glob(pattern) if not p.name.endswith(TMP_SUFFIX))


def wait_reports(
    paths: Sequence[Path] | Callable[[], Sequence[Path]],
    timeout: float = 120.0,
    alive: Callable[[], bool] | None = None,
    what: str = "benchmark processes",
) -> list[str]:
    """Wait until every report in ``paths`` (or a callable listing them: it returns them
    once there are enough) exists; return their texts, in order. TimeoutError after
    ``timeout`` seconds, or as soon as ``alive()`` says the writers are gone."""
    deadline = time.monotonic() + timeout
    while True:
        gone = alive is not None and not alive()  # asked first: its last reports count
        wanted = paths() if callable(paths) else paths
        if wanted and all(p.exists() for p in wanted):
            return [p.read_text() for p in wanted]
        if gone or time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not report in {timeout:g}s: {list(wanted)}")
        time.sleep(0.002)
