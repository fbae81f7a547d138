"""A log specs plugin, installed as torchrun's users install one: a distribution with a
``torchrun.logs_specs`` entry point ``flat`` whose class puts every rank's files side
by side in ``<log_dir>/flat-<run id>/`` (``out-<r>.txt``, ``err-<r>.txt``,
``error-<r>.json``), and ``counted``, torch's default layout through a subclass (as a
site that adds to it writes one)."""

from __future__ import annotations

import os
from pathlib import Path

FLAT_LOGS = """
import os
try:
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, LogsDest, LogsSpecs
except ImportError:
    from agentd.elastic.multiprocessing import DefaultLogsSpecs, LogsDest, LogsSpecs


class FlatLogs(LogsSpecs):
    @property
    def root_log_dir(self):
        return str(self._root_log_dir)

    def reify(self, envs):
        folder = os.path.join(self._root_log_dir, "flat-" + envs[0]["TORCHELASTIC_RUN_ID"])
        os.makedirs(folder, exist_ok=True)
        ranks = range(len(envs))
        dest = LogsDest(
            stdouts={r: os.path.join(folder, f"out-{r}.txt") for r in ranks},
            stderrs={r: os.path.join(folder, f"err-{r}.txt") for r in ranks},
            error_files={r: os.path.join(folder, f"error-{r}.json") for r in ranks},
        )
        for r in ranks:
            envs[r]["TORCHELASTIC_ERROR_FILE"] = dest.error_files[r]
        return dest


class CountedDefault(DefaultLogsSpecs):  # the default layout, each call counted
    def reify(self, envs):
        with open(os.path.join(self._root_log_dir, "reified"), "a") as f:
            f.write("1\\n")
        return super().reify(envs)
"""


def flat_logs_installed(site: Path) -> str:
    """Install the plugin in ``site``; the PYTHONPATH that finds it (then the current one)."""
    info = site / "flatlogs-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: flatlogs\nVersion: 1.0\n")
    points = "flat = flatlogs:FlatLogs\ncounted = flatlogs:CountedDefault\n"
    (info / "entry_points.txt").write_text("[torchrun.logs_specs]\n" + points)
    (site / "flatlogs.py").write_text(FLAT_LOGS)
    return os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH")) if p)
