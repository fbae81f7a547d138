"""``ProcessFailure``, ``ChildFailedError`` and ``@record`` as torch's users and launchers use
them, on both implementations."""

from __future__ import annotations

import datetime
import json
import signal

import pytest

from tests.torch_api.conftest import elastic


def test_a_failure_without_an_error_file_says_how_to_get_one(impl, tmp_path):
    errors = elastic(impl, "multiprocessing.errors")
    failure = errors.ProcessFailure(0, 997, 138, str(tmp_path / "missing.json"))
    assert failure.error_file == "<N/A>" and failure.signal_name() == "<N/A>"
    assert "enable traceback" in failure.message and isinstance(failure.timestamp, int)


def test_a_death_by_signal_names_the_signal_and_pid(impl, tmp_path):
    errors = elastic(impl, "multiprocessing.errors")
    failure = errors.ProcessFailure(1, 4242, -signal.SIGSEGV, str(tmp_path / "missing.json"))
    assert failure.signal_name() == "SIGSEGV"
    assert failure.message == f"Signal {int(signal.SIGSEGV)} (SIGSEGV) received by PID 4242"
    text = str(errors.ChildFailedError("train.py", {3: failure}))
    assert "(SIGSEGV)" in text and f"exitcode  : {-signal.SIGSEGV} (pid: 4242)" in text
    assert "rank      : 3 (local_rank: 1)" in text


@pytest.mark.parametrize("timestamp", [10, "10"])
def test_an_error_file_gives_message_and_whole_second_timestamp(impl, tmp_path, timestamp):
    errors = elastic(impl, "multiprocessing.errors")
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"message": "out of memory", "timestamp": timestamp}))
    failure = errors.ProcessFailure(0, 1, 1, str(path))
    assert (failure.message, failure.timestamp) == ("out of memory", 10)
    assert failure.timestamp_isoformat() == datetime.datetime.fromtimestamp(10).isoformat("_")


def test_a_malformed_error_file_is_refused(impl, tmp_path):
    errors = elastic(impl, "multiprocessing.errors")
    path = tmp_path / "error.json"
    path.write_text(json.dumps({"no": "message"}))
    with pytest.raises(Exception):  # noqa: B017 (torch raises KeyError, agentd ValueError)
        errors.ProcessFailure(0, 1, 1, str(path))


def test_record_writes_the_error_file_the_failure_reads(impl, tmp_path, monkeypatch):
    errors = elastic(impl, "multiprocessing.errors")
    path = tmp_path / "error.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(path))

    @errors.record
    def main():
        raise KeyError("lost")

    with pytest.raises(KeyError):
        main()
    failure = errors.ProcessFailure(0, 1, 1, str(path))
    stamp = failure.error_file_data["message"]["extraInfo"]["timestamp"]
    assert stamp == str(failure.timestamp) and "lost" in json.dumps(failure.error_file_data)


def test_record_takes_an_error_handler_of_the_callers(impl, tmp_path, monkeypatch):
    """torch's second argument (agentd's ``record`` took the function alone)."""
    errors = elastic(impl, "multiprocessing.errors")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))
    seen = []

    class Collecting(errors.ErrorHandler):
        def record_exception(self, e: BaseException) -> None:
            seen.append(repr(e))

    def main():
        raise KeyError("lost")

    with pytest.raises(KeyError):
        errors.record(main, error_handler=Collecting())()
    assert seen == ["KeyError('lost')"] and not (tmp_path / "error.json").exists()


def test_record_treats_exit_0_as_success(impl, tmp_path, monkeypatch):
    errors = elastic(impl, "multiprocessing.errors")
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(tmp_path / "error.json"))

    @errors.record
    def main():
        raise SystemExit(0)

    assert main() is None and not (tmp_path / "error.json").exists()


def test_record_copies_only_a_childs_error_file(impl, tmp_path, monkeypatch):
    errors = elastic(impl, "multiprocessing.errors")
    mine = tmp_path / "launcher.json"
    monkeypatch.setenv("TORCHELASTIC_ERROR_FILE", str(mine))

    @errors.record
    def launch(child_error_file: str):
        failure = errors.ProcessFailure(0, 997, 1, child_error_file)
        raise errors.ChildFailedError("trainer", {0: failure})

    with pytest.raises(errors.ChildFailedError):
        launch("")
    assert not mine.exists()  # the child left nothing: nothing to pass up
    child = tmp_path / "child.json"
    with monkeypatch.context() as env:
        env.setenv("TORCHELASTIC_ERROR_FILE", str(child))
        errors.ErrorHandler().record_exception(RuntimeError("root cause"))
    with pytest.raises(errors.ChildFailedError):
        launch(str(child))
    assert "root cause" in mine.read_text()


def test_the_error_code_is_set_in_a_root_cause_whose_message_is_an_object(impl, caplog):
    """``override_error_code_in_rootcause_data``, as torch's ``dump_error_file`` uses it:
    the code goes in the ``@record`` format's message object, in place; a string message,
    or none, is left alone, with a warning naming the file."""
    handler = elastic(impl, "multiprocessing.errors").ErrorHandler()
    recorded = {"message": {"message": "RuntimeError: boom", "extraInfo": {}}}
    handler.override_error_code_in_rootcause_data("child.json", recorded, -11)
    assert recorded["message"]["errorCode"] == -11
    for other in ({"message": "RuntimeError: boom"}, {"timestamp": "1"}):
        before = json.dumps(other)
        caplog.clear()
        handler.override_error_code_in_rootcause_data("child.json", other, -11)
        assert json.dumps(other) == before
        assert "child.json" in caplog.text
