"""The zygote's fork loop, on a real socket pair: how it sees its agent go."""

from collections.abc import Iterator
from contextlib import contextmanager

from agentd.preload import wire
from agentd.preload.zygote import Zygote


@contextmanager
def zygote_after(reports: int) -> Iterator[Zygote]:
    """A zygote whose agent closed its end with ``reports`` of the zygote's unread."""
    agent, zygote_end = wire.socketpair()
    for pid in range(reports):
        wire.send(zygote_end, {"exited": 100 + pid, "status": 0})
    agent.close()  # as the kernel closes it when the agent is SIGKILLed
    zygote = Zygote(zygote_end)
    try:
        yield zygote
    finally:
        for sock in (zygote_end, zygote.wake_r, zygote.wake_w):
            sock.close()
        zygote.selector.close()


def test_an_agent_killed_with_reports_unread_ends_the_loop_quietly():
    with zygote_after(reports=1) as zygote:  # its read is a reset: no traceback
        assert zygote.on_message() is False


def test_an_agent_that_closed_the_channel_ends_the_loop():
    with zygote_after(reports=0) as zygote:
        assert zygote.on_message() is False
