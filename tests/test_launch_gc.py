"""The launch pauses garbage collection until the workers run, and always resumes it.

Each test runs ``python -m agentd`` for real, with a probe that reports the agent
process's collector state at exit.
"""

from __future__ import annotations

import ast
import subprocess
import sys

from tests.conftest import WORKER

PROBE = """
import atexit, gc, runpy, sys
atexit.register(lambda: print({"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}))
sys.argv = ["agentd", *sys.argv[1:]]
runpy.run_module("agentd", run_name="__main__")
"""


def agent_collector(tmp_path, *args: str) -> tuple[int, dict[str, object]]:
    argv = [sys.executable, "-c", PROBE, *args]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return out.returncode, ast.literal_eval(out.stdout.strip().splitlines()[-1])


def test_collection_resumes_once_the_workers_run_with_the_start_frozen(tmp_path):
    code, collector = agent_collector(
        tmp_path,
        "run",
        "--standalone",
        "--nproc-per-node",
        "2",
        "--log-dir",
        str(tmp_path),
        WORKER,
        "ok",
    )
    assert code == 0
    assert collector["enabled"] is True
    assert isinstance(collector["frozen"], int) and collector["frozen"] > 1000


def test_collection_resumes_when_the_workers_never_run(tmp_path):
    (tmp_path / "a-file").write_text("")  # the log dir cannot be made under it: exit 3
    code, collector = agent_collector(
        tmp_path,
        "run",
        "--standalone",
        "--log-dir",
        str(tmp_path / "a-file" / "logs"),
        WORKER,
        "ok",
    )
    assert code == 3
    assert collector == {"enabled": True, "frozen": 0}


def test_collection_resumes_after_a_usage_error(tmp_path):
    code, collector = agent_collector(tmp_path, "run", "--nproc-per-node", "zero", WORKER)
    assert code == 2
    assert collector == {"enabled": True, "frozen": 0}


def test_other_commands_collect_as_usual(tmp_path):
    code, collector = agent_collector(tmp_path, "status", "--url", "http://127.0.0.1:1")
    assert code == 3
    assert collector == {"enabled": True, "frozen": 0}
