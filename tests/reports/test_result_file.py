"""ResultFile: reserved at start, so the outcome fits even when the disk fills up."""

from __future__ import annotations

import json

from agentd.reports.result_file import RESERVED_BYTES, ResultFile


def test_the_placeholder_is_valid_json_and_reserves_its_blocks(tmp_path):
    result = ResultFile(tmp_path / "result.json")
    result.reserve({"state": "INIT", "outcome": "running"})
    assert result.path.stat().st_size == RESERVED_BYTES
    assert json.loads(result.path.read_text()) == {"state": "INIT", "outcome": "running"}
    assert result.write({"state": "SUCCEEDED", "failures": []})
    assert json.loads(result.path.read_text()) == {"state": "SUCCEEDED", "failures": []}
    assert result.path.stat().st_size < 100


def test_a_large_outcome_is_written_whole_when_there_is_room(tmp_path):
    result = ResultFile(tmp_path / "result.json")
    result.reserve({"state": "INIT"})
    big = {"state": "FAILED", "failures": [{"traceback": "t" * 50_000}] * 4}
    assert result.write(big)
    assert json.loads(result.path.read_text()) == big


def test_without_room_a_large_outcome_is_trimmed_into_the_reservation(tmp_path, monkeypatch):
    result = ResultFile(tmp_path / "result.json")
    result.reserve({"state": "INIT"})
    monkeypatch.setattr(result, "_replace", lambda data: False)  # the disk is full
    failure = {"rank": 1, "traceback": "line\n" * 20_000, "stderr_tail": "e" * 30_000}
    big = {"state": "FAILED", "root_cause": failure, "failures": [failure] * 20}
    assert result.write(big)
    doc = json.loads(result.path.read_text())
    assert doc["state"] == "FAILED" and doc["root_cause"]["rank"] == 1
    assert len(doc["root_cause"]["traceback"]) == 2048 and doc["failures_trimmed"]
    assert len(doc["failures"]) == 8


def test_nothing_reserved_and_no_room_is_reported_not_raised(tmp_path, monkeypatch, caplog):
    result = ResultFile(tmp_path / "missing-dir" / "result.json")
    result.reserve({"state": "INIT"})
    assert not result.reserved
    assert not result.write({"state": "FAILED"})
    assert "the report above is the only record" in caplog.text
