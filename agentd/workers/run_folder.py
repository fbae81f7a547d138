"""Which folder of the log directory holds a run's files on this host.

A log directory on a filesystem that several hosts mount (a Slurm cluster's home or
scratch) is one folder for every node of the job: ``<log_dir>/<run_id>`` would then hold
every node's ``attempt_0/0/stdout.log`` and ``result.json`` at once. The first host to
create the run's folder claims it (a ``.host`` file naming it, made exclusively); an agent
of another host finds the claim and takes ``<run_id>.<host>`` instead, the same on each of
its restarts. Agents on one host share the run's folder, as before.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

CLAIM = ".host"
"""The file in a run's folder that names the host whose agent writes there."""


def claim_run_dir(base: Path, name: str, host: str) -> Path:
    """The run's folder ``base/name``, claimed for ``host``; ``base/name.host`` where
    another host claimed that one. A folder that cannot be made or claimed is returned
    as is: the agent's start says why it cannot write there."""
    run_dir = base / name
    mark = run_dir / CLAIM
    draft = run_dir / f"{CLAIM}.{os.getpid()}"
    try:
        os.makedirs(run_dir, mode=0o700, exist_ok=True)
        draft.write_text(host + "\n")
        os.link(draft, mark)  # whole or not at all, and only once (on NFS too)
    except FileExistsError:
        try:
            owner = mark.read_text().strip()
        except OSError:
            return run_dir
        if owner != host:
            return base / f"{name}.{host.replace(os.sep, '_')}"
    except OSError:
        pass
    finally:
        with contextlib.suppress(OSError):
            draft.unlink(missing_ok=True)
    return run_dir
