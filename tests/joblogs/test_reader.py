"""An agent's log files read as whole, timed lines (``GET /logs``'s reader), the times
the output sink keeps beside a log file, and the query's clear errors."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agentd.joblogs.http import BadQuery, decode_cursor, encode_cursor, parse_query
from agentd.joblogs.reader import MAX_BYTES, LogReader
from agentd.wire import line_times
from agentd.workers.output import StreamRoute, StreamSink


def write_log(
    run_dir: Path,
    attempt: int,
    local_rank: int,
    rank: int,
    chunks: list[tuple[float, bytes]],
    stream: str = "stdout",
) -> Path:
    folder = run_dir / f"attempt_{attempt}" / str(local_rank)
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / f"{stream}.log"
    times = [line_times.header(rank, attempt).decode()]
    data = b""
    for at, chunk in chunks:
        times.append(line_times.record(len(data), at).decode())
        data += chunk
    log.write_bytes(data)
    (folder / f"{stream}.log.times").write_text("".join(times))
    return log


def texts(lines) -> list[tuple[int, str]]:
    return [(line.rank, line.text) for line in lines]


def test_lines_of_every_rank_in_time_order_whole_and_from_a_cursor(tmp_path):
    write_log(tmp_path, 0, 0, 4, [(10.0, b"a1\na2\n"), (12.0, b"a3\npart")])
    write_log(tmp_path, 0, 1, 5, [(11.0, b"b1\r\n"), (13.0, b"10%\r50%\r100%\n")])
    reader = LogReader(tmp_path)
    lines, cursor, more = reader.read({}, current_attempt=0)
    assert texts(lines) == [(4, "a1"), (4, "a2"), (5, "b1"), (4, "a3"), (5, "100%")]
    assert [line.at for line in lines] == [10.0, 10.0, 11.0, 12.0, 13.0] and not more
    assert reader.read(cursor, current_attempt=0)[0] == []  # "part" waits for its end
    log = tmp_path / "attempt_0" / "0" / "stdout.log"
    log.write_bytes(log.read_bytes() + b" two\n")
    again, _, _ = reader.read(cursor, current_attempt=0)
    assert texts(again) == [(4, "part two")]
    assert texts(reader.read(cursor, current_attempt=1)[0]) == [(4, "part two")]


def test_a_finished_attempts_last_line_is_given_without_its_end(tmp_path):
    write_log(tmp_path, 0, 0, 0, [(5.0, b"done\nlast words")])
    lines, _, _ = LogReader(tmp_path).read({}, current_attempt=1)
    assert [(line.attempt, line.text) for line in lines] == [(0, "done"), (0, "last words")]


def test_since_rank_and_the_stream(tmp_path):
    write_log(tmp_path, 0, 0, 0, [(1.0, b"old\n"), (5.0, b"new\n")])
    write_log(tmp_path, 0, 1, 1, [(6.0, b"other\n")])
    write_log(tmp_path, 0, 1, 1, [(7.0, b"trouble\n")], stream="stderr")
    reader = LogReader(tmp_path)
    assert texts(reader.read({}, 0, since=4.0)[0]) == [(0, "new"), (1, "other"), (1, "trouble")]
    only = reader.read({}, 0, rank=1)[0]
    assert [(line.stream, line.text) for line in only] == [
        ("stdout", "other"),
        ("stderr", "trouble"),
    ]


def test_a_read_stops_at_its_budget_and_says_there_is_more(tmp_path):
    big = b"x" * 1000 + b"\n"
    write_log(tmp_path, 0, 0, 0, [(1.0, big * (MAX_BYTES // len(big) + 10))])
    reader = LogReader(tmp_path)
    first, cursor, more = reader.read({}, 0)
    rest, _, more_after = reader.read(cursor, 0)
    assert more and not more_after and len(first) + len(rest) == MAX_BYTES // len(big) + 10


def test_the_sink_keeps_the_times_of_its_log_file(tmp_path):
    path = tmp_path / "stdout.log"
    sink = StreamSink(StreamRoute(path, times_of=(7, 2)))
    before = time.time()
    sink.feed(b"one\ntw")
    sink.feed(b"o\n")  # within the interval: no record of its own
    time.sleep(line_times.INTERVAL + 0.01)
    sink.feed(b"three\n")
    sink.close()
    parsed = line_times.parse((tmp_path / "stdout.log.times").read_text())
    assert (parsed.rank, parsed.attempt, parsed.offsets) == (7, 2, [0, 8])
    assert before - 0.001 <= parsed.times[0] <= parsed.times[1] <= time.time() + 0.001  # ms


def test_a_torn_or_foreign_times_file_is_read_as_far_as_it_goes():
    parsed = line_times.parse("agentd-line-times 1 rank=3 attempt=1\n0 1.5\nbad line\n9 2.5\n12 3")
    assert (parsed.rank, parsed.offsets, parsed.times) == (3, [0, 9], [1.5, 2.5])
    assert parsed.time_at(10, default=0.0) == 2.5 and parsed.time_at(0, default=0.0) == 1.5
    assert line_times.parse("").offsets == []


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ({"since": "yesterday"}, "since: 'yesterday' must be a time in epoch seconds"),
        ({"since": "-5"}, "since: '-5' must be a time in epoch seconds"),
        ({"rank": "two"}, "rank: 'two' must be a global rank (an integer >= 0)"),
        ({"cursor": "not-a-cursor!"}, "cursor: 'not-a-cursor!' is not a cursor an earlier"),
        ({"cursor": encode_cursor({"0/0/stdout": -1})}, "is not a cursor an earlier answer gave"),
        ({"rnak": "3"}, "rnak: not a parameter of GET /logs (it takes: cursor, since, rank)"),
    ],
)
def test_a_bad_query_names_its_field(query, message):
    with pytest.raises(BadQuery, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_query(query)


def test_a_cursor_goes_there_and_back():
    cursor = {"0/0/stdout": 12, "1/3/stderr": 0}
    assert decode_cursor(encode_cursor(cursor)) == cursor
    assert parse_query({"cursor": encode_cursor(cursor), "since": "5", "rank": "3"}) == (
        cursor,
        5.0,
        3,
    )
