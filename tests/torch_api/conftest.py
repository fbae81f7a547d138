"""The torch API suite: each test is written the way a torch user writes the code, and
runs against ``torch.distributed.elastic`` (the reference, where torch is installed) and
against ``agentd.elastic``, which must behave the same. Tests that hold for agentd only
say why (a documented difference)."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).parent / "scripts"
PREFIXES = {"torch": "torch.distributed.elastic", "agentd": "agentd.elastic"}
LAUNCHERS = {"torch": "torch.distributed.launcher.api", "agentd": "agentd.launcher"}


@pytest.fixture(params=["torch", "agentd"])
def impl(request) -> str:
    """The implementation under test: 'torch' (skipped without torch) or 'agentd'."""
    if request.param == "torch":
        pytest.importorskip("torch.distributed.elastic")
    return request.param


def elastic(impl: str, module: str = ""):
    """``<prefix>.<module>`` of the implementation."""
    name = PREFIXES[impl] + (f".{module}" if module else "")
    return importlib.import_module(name)


SCRIPT_TIMEOUT = 120
"""The bound on one script's run: torch's launcher spawns workers that each import torch
(``launch.py fail`` takes 9 s alone, and passed pytest's 60 s at three test processes a
core)."""
RUNS_SCRIPTS = pytest.mark.timeout(SCRIPT_TIMEOUT + 30)
"""For the modules that run scripts: pytest's bound must not cut the script's short."""


def run_script(
    impl: str, name: str, *args: str, timeout: float = SCRIPT_TIMEOUT, extra_env: dict | None = None
) -> dict:
    """Run ``scripts/<name>`` with ``ELASTIC`` naming the implementation's prefix; returns
    the JSON object its last stdout line holds."""
    env = {
        **os.environ,
        "ELASTIC": PREFIXES[impl],
        "LAUNCHER": LAUNCHERS[impl],
        "PYTHONWARNINGS": "ignore",
        **(extra_env or {}),
    }
    proc = subprocess.run(
        [sys.executable, str(SCRIPTS / name), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        stdin=subprocess.DEVNULL,
    )
    lines = proc.stdout.strip().splitlines()
    assert proc.returncode == 0 and lines, (
        proc.returncode,
        proc.stdout[-2000:],
        proc.stderr[-4000:],
    )
    result = json.loads(lines[-1])
    result["stderr"] = proc.stderr
    return result
