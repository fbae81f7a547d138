"""The in-process channel's messages: what each side accepts, and how a bad line is named."""

import pytest

from agentd.inprocess import wire


def test_round_trip_of_each_message():
    assert wire.decode(wire.encode("hello"), wire.WORKER_OPS) == {"op": "hello"}
    resume = wire.encode("resume", env={"RANK": "3"})
    assert wire.decode(resume, wire.AGENT_OPS) == {"op": "resume", "env": {"RANK": "3"}}


@pytest.mark.parametrize(
    ("line", "ops", "names"),
    [
        (b"not json", wire.WORKER_OPS, "not JSON"),
        (b'["hello"]', wire.WORKER_OPS, "op must be one of ['error', 'hello', 'parked']"),
        (b'{"op": "park"}', wire.WORKER_OPS, "op must be one of"),  # the agent's op, not ours
        (b'{"op": "resume", "env": {"RANK": 3}}', wire.AGENT_OPS, "env must map names"),
        (b'{"op": "resume", "env": []}', wire.AGENT_OPS, "env must map names"),
        (b"x" * (wire.MAX_LINE + 1), wire.WORKER_OPS, "exceeds"),
    ],
)
def test_a_bad_line_is_refused_with_the_reason(line, ops, names):
    with pytest.raises(wire.ProtocolError, match=names.replace("[", r"\[").replace("]", r"\]")):
        wire.decode(line, ops)
