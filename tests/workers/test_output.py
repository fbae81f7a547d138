from __future__ import annotations

import io
import logging
import re

from agentd.support.ratelog import RateLimitedLog
from agentd.workers import output as logs
from agentd.workers.output import MAX_PARTIAL_LINE, StreamRoute, StreamSink, plan_route


class Console(io.BytesIO):
    pass


def test_prefixed_lines_are_never_split(tmp_path):
    console = Console()
    sink = StreamSink(StreamRoute(tmp_path / "out.log", console, b"[r0]:", keep_tail=True))
    for chunk in (b"al", b"pha\nbe", b"ta\ngam", b"ma"):
        sink.feed(chunk)
    assert console.getvalue() == b"[r0]:alpha\n[r0]:beta\n"
    sink.close()
    assert console.getvalue() == b"[r0]:alpha\n[r0]:beta\n[r0]:gamma\n"
    assert (tmp_path / "out.log").read_bytes() == b"alpha\nbeta\ngamma"
    assert sink.tail(2) == "beta\ngamma"


def test_raw_console_passes_chunks_through():
    console = Console()
    sink = StreamSink(StreamRoute(None, console, None))
    sink.feed(b"50%\r")
    assert console.getvalue() == b"50%\r"  # progress bars keep working
    sink.close()


def test_tail_is_bounded():
    sink = StreamSink(StreamRoute(keep_tail=True))
    for i in range(10000):
        sink.feed(f"line {i}\n".encode())
    assert sink.tail(3) == "line 9997\nline 9998\nline 9999"
    assert len(sink._tail) <= 16 * 1024


def test_routes(tmp_path):
    path = tmp_path / "f"
    plain_out = plan_route(
        redirect=False, tee=False, shown=True, is_stderr=False, file_path=path, prefix="p"
    )
    assert plain_out.inherit and not plain_out.piped
    plain_err = plan_route(
        redirect=False, tee=False, shown=True, is_stderr=True, file_path=path, prefix="p"
    )
    assert plain_err.piped and plain_err.keep_tail and plain_err.prefix is None
    redirected = plan_route(
        redirect=True, tee=False, shown=True, is_stderr=False, file_path=path, prefix="p"
    )
    assert redirected.file_path == path and redirected.console is None
    teed = plan_route(
        redirect=True, tee=True, shown=True, is_stderr=False, file_path=path, prefix="p"
    )
    assert teed.file_path == path and teed.console is not None and teed.prefix == b"p"
    hidden = plan_route(
        redirect=False, tee=False, shown=False, is_stderr=False, file_path=path, prefix="p"
    )
    assert not hidden.piped and not hidden.inherit  # to /dev/null


def test_carriage_returns_end_console_lines_and_keep_their_prefix():
    console = Console()
    sink = StreamSink(StreamRoute(None, console, b"[r0]:"))
    for chunk in (b" 10%|#", b"  |\r 20%|##  |\r", b" 30%|###|\r", b"\ndone\r\n", b"x\r", b"y"):
        sink.feed(chunk)
    sink.close()
    assert console.getvalue() == (
        b"[r0]: 10%|#  |\r[r0]: 20%|##  |\r[r0]: 30%|###|\r\n[r0]:done\r\n[r0]:x\r[r0]:y\n"
    )


def test_a_line_without_end_is_flushed_in_bounded_pieces():
    console = Console()
    sink = StreamSink(StreamRoute(None, console, b">"))
    piece = MAX_PARTIAL_LINE
    for _ in range(40):
        sink.feed(b"z" * (piece // 4))
        assert len(sink._partial) < piece
    sink.close()
    lines = console.getvalue().split(b"\n")
    assert lines[-1] == b"" and all(line == b">" + b"z" * piece for line in lines[:-1])
    assert len(lines) - 1 == 10


def test_a_full_disk_costs_neither_the_console_nor_the_tail(tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(logs, "_DISK_PROBLEMS", RateLimitedLog(logs.log, 30.0))
    full = tmp_path / "out.log"
    full.symlink_to("/dev/full")  # every write: ENOSPC, as on a full filesystem
    console = Console()
    sinks = [StreamSink(StreamRoute(full, console, b"[r]:", keep_tail=True)) for _ in range(3)]
    with caplog.at_level(logging.WARNING):
        for i in range(100):
            for sink in sinks:
                sink.feed(f"line {i}\n".encode())
    assert console.getvalue().count(b"[r]:line 99\n") == 3
    assert sinks[0].tail(1) == "line 99" and sinks[0].lost_bytes == sum(
        len(f"line {i}\n") for i in range(100)
    )
    [record] = caplog.records  # one line for every stream and every write
    assert record.getMessage().startswith(f"log dir full: cannot write {full}: No space left")
    for sink in sinks:
        sink.close()


def test_a_prefix_is_copied_literally_whatever_it_holds():
    console = Console()
    sink = StreamSink(StreamRoute(None, console, rb"[C:\new\1 \g<0>]"))
    sink.feed(b"a\nb\r\nc")
    sink.close()
    assert console.getvalue() == rb"[C:\new\1 \g<0>]a" + b"\n" + rb"[C:\new\1 \g<0>]b" + (
        b"\r\n" + rb"[C:\new\1 \g<0>]c" + b"\n"
    )


def test_attempt_directories_keep_the_first_and_the_last_n(tmp_path):
    from agentd.workers.output import prune_attempts

    for attempt in range(12):
        (tmp_path / f"attempt_{attempt}" / "0").mkdir(parents=True)
    assert prune_attempts(tmp_path, 11, 3) == list(range(1, 9))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "attempt_0",
        "attempt_10",
        "attempt_11",
        "attempt_9",
    ]
    assert prune_attempts(tmp_path, 11, 0) == []  # 0 keeps everything


def test_the_next_attempts_directories_are_made_ahead_and_renamed_into_place(tmp_path):
    from agentd.workers.output import (
        STAGED_ATTEMPT,
        drop_staged_attempt,
        stage_next_attempt,
        take_staged_attempt,
    )

    stage_next_attempt(tmp_path, [0, 1])
    assert sorted(p.name for p in (tmp_path / STAGED_ATTEMPT).iterdir()) == ["0", "1"]
    assert take_staged_attempt(tmp_path, 1) is True
    assert sorted(p.name for p in (tmp_path / "attempt_1").iterdir()) == ["0", "1"]
    assert not (tmp_path / STAGED_ATTEMPT).exists()
    take_staged_attempt(tmp_path, 2)  # nothing staged: the attempt makes its own
    assert not (tmp_path / "attempt_2").exists()

    (tmp_path / "attempt_1" / "0" / "stdout.log").write_text("kept")
    stage_next_attempt(tmp_path, [0, 1])
    take_staged_attempt(tmp_path, 1)  # an attempt with files is never replaced
    assert (tmp_path / "attempt_1" / "0" / "stdout.log").read_text() == "kept"
    drop_staged_attempt(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["attempt_1"]

    (tmp_path / f"{STAGED_ATTEMPT}.part").mkdir()
    (tmp_path / f"{STAGED_ATTEMPT}.part" / "1").write_text("")  # rank 1 cannot be made
    stage_next_attempt(tmp_path, [0, 1])
    assert not (tmp_path / STAGED_ATTEMPT).exists()  # nothing half made is ever taken
    assert take_staged_attempt(tmp_path, 2) is False


def test_the_event_log_is_rotated_past_its_size(tmp_path):
    from agentd.telemetry.events import Event, JsonLinesFile

    path = tmp_path / "events.jsonl"
    sink = JsonLinesFile(str(path), max_bytes=2000)
    for i in range(100):
        sink(Event("restart", metadata={"restart_count": i}))
    sink.close()
    assert path.stat().st_size <= 2000 and (tmp_path / "events.jsonl.1").stat().st_size <= 2000
    assert '"restart_count": 99' in path.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["events.jsonl", "events.jsonl.1"]


def test_an_event_log_that_cannot_be_opened_after_rotation_is_said_once_and_retried(
    tmp_path, caplog
):
    """Before: the reopen's failure left the file closed, and every later event was
    reported as a disk problem, never as the lost file it was."""
    from agentd.telemetry.events import Event, JsonLinesFile

    logs = tmp_path / "logs"
    logs.mkdir()
    path = logs / "events.jsonl"
    sink = JsonLinesFile(str(path), max_bytes=300)
    sink(Event("first"))
    path.unlink()
    logs.rmdir()  # the log dir is gone: neither the rotation nor the new file can be made
    for i in range(20):
        sink(Event("restart", metadata={"restart_count": i}))
    assert sink.lost == 18  # the first two went to the unlinked file, before its rotation
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 1 and "cannot open it again after its rotation" in said[0].message
    logs.mkdir()  # back: the next event reopens the file and says how many were dropped
    sink(Event("after"))
    sink.close()
    assert sink.lost == 0 and '"name": "after"' in path.read_text()
    said = [r.message for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) == 2 and re.search(r"open again; \d+ event\(s\) were dropped", said[1])
