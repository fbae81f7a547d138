"""``agentd logs --dir FOLDER``: a run's log files read from disk, for a job whose agents
are gone (a failed job's post-mortem) or serve no health endpoint.

FOLDER is a run's folder of the log directory (``<log dir>/<run id>``, as an agent's start
line names it), or one attempt's in it (``.../attempt_<n>``: that attempt's lines only).
On a filesystem several hosts mount, each host's agent wrote its own folder beside the
first (``<run id>.<host>``, :mod:`agentd.workers.run_folder`): those are read too, each
host named by its folder's claim, and every line is merged in time order as ``agentd
logs`` merges the agents' answers. The files are read as they are: a worker still
running has its last line shown even where it is not finished yet.
"""

from __future__ import annotations

import glob
import heapq
import os
import sys
from pathlib import Path
from typing import NamedTuple

from agentd.joblogs.errors import LogsError
from agentd.joblogs.reader import ATTEMPT, LogReader
from agentd.workers.run_folder import CLAIM

EVERY_ATTEMPT_OVER = sys.maxsize
"""The reader's current attempt for files read after the fact: every attempt is over, so
a last line without its newline is shown."""


class RunFolder(NamedTuple):
    host: str
    """The host whose agent wrote it (its claim; else the folder's name)."""
    path: Path


def run_folders(given: str) -> tuple[list[RunFolder], int | None]:
    """The run's folders ``given`` names (its own and the other hosts' beside it), and the
    one attempt it names, if any; a :class:`LogsError` where it names none."""
    path = Path(given).expanduser()
    if not given.strip() or not path.is_dir():  # '' would be the working directory
        raise LogsError(f"--dir: {given!r} is not a directory", 2)
    attempt = None
    if found := ATTEMPT.match(path.name):
        path, attempt = path.parent, int(found.group(1))
    folders = [RunFolder(_host(path), path)]
    for sibling in sorted(path.parent.glob(f"{glob.escape(path.name)}.*")):
        host = _host(sibling)  # another host's folder of this run, not a run "<id>.v2"
        if sibling.is_dir() and sibling.name == f"{path.name}.{host.replace(os.sep, '_')}":
            folders.append(RunFolder(host, sibling))
    return folders, attempt


def _host(folder: Path) -> str:
    try:
        return (folder / CLAIM).read_text().strip() or folder.name
    except OSError:
        return folder.name


def folder_lines(
    given: str, since: float | None, rank: int | None, node: str | None
) -> list[tuple[float, int, str]]:
    """Every line of the run's folders (of ``rank``, from ``since``, of the host ``node``
    names, when given), merged in time order, each as ``agentd logs`` prints it."""
    folders, attempt = run_folders(given)
    if node is not None:
        folders = [f for f in folders if node in (f.host, f.path.name)]
        if not folders:
            raise LogsError(f"--node: {node!r} is no host of the folders of {given!r}", 2)
    batches: list[list[tuple[float, int, str]]] = []
    files = 0
    for folder in folders:
        reader = LogReader(folder.path)
        cursor: dict[str, int] = {}
        lines: list[tuple[float, int, str]] = []
        while True:
            got, cursor, more = reader.read(cursor, EVERY_ATTEMPT_OVER, since, rank)
            lines += [
                (line.at, len(lines) + i, line.shown(folder.host))
                for i, line in enumerate(got)
                if attempt is None or line.attempt == attempt
            ]
            if not more:
                break
        files += reader.files
        batches.append(lines)
    if not files:
        found = {p.parent.name for p in Path(given).glob("*/attempt_*")}
        other_hosts = {n for n in found for run in found if n.startswith(f"{run}.")}
        if runs := sorted(str(Path(given, n)) for n in found - other_hosts):
            raise LogsError(
                f"--dir: {given!r} is a log directory: give the folder of one of its runs "
                f"({', '.join(runs[:3])}{', ...' if len(runs) > 3 else ''})",
                2,
            )
        raise LogsError(
            f"--dir: {given!r} holds no worker log files (attempt_<n>/<local rank>/"
            "stdout.log): its agent writes them with --tee 3 (or --redirects 3)",
            1,
        )
    return list(heapq.merge(*batches))
