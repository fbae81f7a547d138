from __future__ import annotations

import io

from agentd.logs import StreamRoute, StreamSink, plan_route


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
