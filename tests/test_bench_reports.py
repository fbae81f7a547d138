"""Benchmarks read what other processes wrote only once it is whole (issue 23: a node's
result file was read while empty and bench_rdzv crashed with JSONDecodeError)."""

from __future__ import annotations

import ast
import importlib.util
import subprocess
import sys
import threading
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
_spec = importlib.util.spec_from_file_location("report_files", BENCH / "report_files.py")
assert _spec is not None and _spec.loader is not None
report_files = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(report_files)
reports, wait_reports, write_report = (
    report_files.reports,
    report_files.wait_reports,
    report_files.write_report,
)

LOGS = {
    ("bench_chaos.py", "out"),
    ("bench_chaos.py", "err"),
    ("chaos_worker.py", "os.path.join(OUT, 'starts.jsonl')"),
    ("bench_soak.py", "err"),
    ("bench_timer.py", "log_path"),
    ("bench_recovery.py", "log"),
    ("bench_leave.py", "log_path"),
    ("bench_late_failure.py", "log_path"),
    ("bench_first_step.py", "log_path"),
    ("bench_stragglers.py", "log_path"),
    ("bench_defaults.py", "err"),
    ("bench_grow.py", "err"),
    ("bench_seed_back.py", "log"),
    ("bench_rdzv.py", "log_path"),
    ("bench_barrier_host.py", "logs[i]"),
}
"""Files opened for writing that are a subprocess's stderr, read after it exited."""


def test_a_report_is_renamed_into_place_whole(tmp_path):
    write_report(tmp_path / "r.json", '{"done": 1}')
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
    assert (tmp_path / "r.json").read_text() == '{"done": 1}'


def test_waiting_ignores_temporaries_and_returns_once_every_report_is_there(tmp_path):
    half = tmp_path / f"a.{12345}.tmp"
    half.write_text('{"jo')  # a writer caught in the middle
    assert reports(tmp_path, "a*") == []
    wanted = [tmp_path / "a", tmp_path / "b"]
    writer = threading.Timer(0.05, lambda: [write_report(p, p.name) for p in wanted])
    writer.start()
    try:
        assert wait_reports(wanted, timeout=30) == ["a", "b"]
    finally:
        writer.join()


def test_waiting_ends_when_the_writers_are_gone(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    with pytest.raises(TimeoutError, match="did not report"):
        wait_reports([tmp_path / "never"], timeout=60, alive=lambda: proc.poll() is None)


def test_a_report_written_just_before_its_writer_exits_is_read(tmp_path):
    path = tmp_path / "last"
    code = (
        f"import sys; sys.path.insert(0, {str(BENCH)!r}); import report_files; "
        f"report_files.write_report({str(path)!r}, '7')"
    )
    proc = subprocess.Popen([sys.executable, "-c", code])
    try:
        assert wait_reports([path], timeout=60, alive=lambda: proc.poll() is None) == ["7"]
    finally:
        proc.wait()


def test_no_benchmark_writes_a_file_another_process_reads_without_write_report():
    """Writing in place (``open(path, "w")``, ``write_text``) lets a reader see a file
    before it is whole: every report goes through report_files.write_report."""
    offenders = []
    for script in sorted(BENCH.glob("*.py")):
        if script.name == "report_files.py":
            continue
        for node in ast.walk(ast.parse(script.read_text())):
            if not isinstance(node, ast.Call):
                continue
            name = getattr(node.func, "attr", getattr(node.func, "id", ""))
            if name in ("write_text", "write_bytes"):
                offenders.append(f"{script.name}:{node.lineno}")
            modes = [a.value for a in node.args[1:2] if isinstance(a, ast.Constant)]
            if name == "open" and any(str(m)[:1] in "wax" for m in modes):
                target = ast.unparse(node.args[0])
                if (script.name, target) not in LOGS:
                    offenders.append(f"{script.name}:{node.lineno} open({target})")
    assert offenders == []
