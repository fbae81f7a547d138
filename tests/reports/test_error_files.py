from __future__ import annotations

import json

import pytest

from agentd.errors.error_file import read_error_file, write_error_file
from agentd.errors.record import record
from agentd.group import RunResult, WorkerFailure, WorkerState
from agentd.reports.failure import format_failure_report


def test_record_writes_torch_format(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @record
    def main():
        raise KeyError("missing")

    with pytest.raises(KeyError):
        main()
    doc = json.loads(path.read_text())
    assert doc["message"]["message"] == "KeyError: 'missing'"
    assert "Traceback" in doc["message"]["extraInfo"]["py_callstack"]
    assert int(doc["message"]["extraInfo"]["timestamp"]) > 0
    content = read_error_file(str(path))
    assert content.message == "KeyError: 'missing'" and "main" in content.traceback


def test_record_passes_success_and_exit_0(tmp_path, monkeypatch):
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))
    assert record(lambda: 5)() == 5

    @record
    def leave():
        raise SystemExit(0)

    assert leave() is None  # torch's @record: a clean exit is not an error, and returns
    assert not path.exists()


def test_write_error_file_without_path_is_silent(monkeypatch):
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    write_error_file(ValueError("x"))


@pytest.mark.parametrize(
    "content",
    ["", "{not json", "[]", '{"other": 1}', '{"message": 5}', "\xff\xfe"],
)
def test_corrupt_error_files_never_raise(tmp_path, content):
    path = tmp_path / "error.json"
    path.write_text(content, errors="surrogateescape")
    assert read_error_file(str(path)) is None


def test_missing_error_file_and_plain_message(tmp_path):
    assert read_error_file(str(tmp_path / "none.json")) is None
    path = tmp_path / "e.json"
    path.write_text('{"message": "plain text"}')
    assert read_error_file(str(path)).message == "plain text"


def test_report_root_cause_and_others():
    root = WorkerFailure(
        1,
        42,
        -11,
        global_rank=1,
        role="trainer",
        timestamp=100.0,
        message="E: bad",
        traceback="tb line",
        host="h",
        error_file="/e.json",
    )
    other = WorkerFailure(
        0, 41, 1, global_rank=0, role="trainer", timestamp=101.0, stderr_tail="tail"
    )
    text = format_failure_report(
        RunResult(WorkerState.FAILED, failures={0: other, 1: root}), "run9", "train.py"
    )
    assert "train.py FAILED (run run9)" in text
    assert "exit code : -11 (SIGSEGV)" in text
    assert "message   : E: bad" in text and "    tb line" in text
    assert "rank 0 (local 0, pid 41): 1" in text
    no_file = WorkerFailure(
        0, 1, 2, global_rank=0, role="t", timestamp=1.0, stderr_tail="line a\nline b"
    )
    text = format_failure_report(RunResult(WorkerState.FAILED, failures={0: no_file}), "r", "x")
    assert "stderr (last lines):\n    line a\n    line b" in text


def test_the_error_files_timestamp_is_the_failures_not_the_exit_time(tmp_path):
    """torch reads when a worker failed from its error file; so does the agent's failure
    (the exit time given is only for a worker that wrote none)."""
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "out of memory", "timestamp": "1700000000"}))
    failure = WorkerFailure(0, 1, 1, error_file=str(path), timestamp=1800000000.5)
    assert failure.timestamp == 1700000000 and failure.message == "out of memory"
    without = WorkerFailure(0, 1, 1, error_file=str(tmp_path / "none.json"), timestamp=1800000000.5)
    assert without.timestamp == 1800000000.5
