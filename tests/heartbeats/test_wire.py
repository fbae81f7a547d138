"""The progress messages on the timer pipe: round trip, bad input, partial lines."""

from __future__ import annotations

import json

import pytest

from agentd.timer.file_pipe import BadRequest, parse_line, parse_request
from agentd.wire.progress import ProgressMessage, encode


def test_progress_messages_round_trip_on_the_timer_pipe_wire():
    line = encode("enter", 42, 7, 123.25, 'check"point', dump_signal=39)
    assert line.endswith(b"\n")
    parsed = parse_request(line.rstrip(b"\n"))
    assert parsed == ProgressMessage(42, "enter", 7, 123.25, 'check"point', 39)
    assert parse_request(encode("beat", 42, 8, 124.0).rstrip()) == ProgressMessage(
        42, "beat", 8, 124.0
    )


@pytest.mark.parametrize(
    ("doc", "rule"),
    [
        ({"kind": "nap"}, "kind: 'nap' must be one of beat, enter, exit, done, parked"),
        ({"pid": 0}, "pid: 0 must be a positive integer"),
        ({"steps": -1}, "steps: -1 must be an integer"),
        ({"steps": 2**60}, "steps: 1152921504606846976 must be an integer"),
        ({"at": "soon"}, "at: 'soon' must be a finite number"),
        ({"at": float("nan")}, "at: nan must be a finite number"),
        ({"kind": "enter"}, "section: None must be a non-empty string"),
        ({"kind": "exit", "section": "x" * 200}, "section: 'xxx"),
        ({"section": "a"}, "section: only enter and exit messages name one, not beat"),
        ({"dump_signal": 4096}, "dump_signal: 4096 must be a signal number"),
    ],
)
def test_bad_progress_messages_name_the_field_and_rule(doc, rule):
    base = {"version": 2, "kind": "beat", "pid": 42, "steps": 1, "at": 5.0}
    with pytest.raises(BadRequest) as info:
        parse_request(json.dumps({**base, **doc}).encode())
    assert str(info.value).startswith(rule)


def test_a_progress_message_glued_to_a_partial_line_survives():
    line = b'{"version": 1, "pid": 12' + encode("beat", 42, 3, 9.5).rstrip()
    message, problem = parse_line(line)
    assert message == ProgressMessage(42, "beat", 3, 9.5)
    assert problem is not None and "stray bytes" in problem
