"""Malformed HTTP from anyone who can connect: every listener answers 400 and logs one
WARNING line per interval with a count, never a traceback (issue 23); header bytes that
are not UTF-8 on every route of every listener (issue 36)."""

from __future__ import annotations

import re
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from agentd.store.ops import OPS
from agentd.store.server import CANDIDATE_OPS
from tests.conftest import WORKER, free_port, wait_until

MALFORMED = [
    b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Nul: a\x00b\r\n\r\n",  # a NUL byte in a header
    b"GET /livez HTTP/1.1\r\nHost: x\r\nX-Long: " + b"a" * 8192 + b"\r\n\r\n",  # 8 KiB line
    b"GET /livez HTTP/9.9\r\nHost: x\r\n\r\n",  # a bad request line
    b"POST /v1/get HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
    b"GET /livez HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n",
    b"GET /livez HTTP/1.1\r\n Host: x\r\n\r\n",  # a header line that starts with a space
] * 2


def send(port: int, request: bytes) -> bytes:
    """``request`` on a fresh connection; the status line of the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(request)
        answer = b""
        while b"\r\n" not in answer:
            chunk = conn.recv(4096)
            if not chunk:
                break
            answer += chunk
    return answer.split(b"\r\n", 1)[0]


def assert_one_warning_per_listener(err: str, listener: str) -> None:
    assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if "malformed request" in line]
    assert len(lines) == 1, lines
    assert (
        f"WARNING agentd.support.http_site: {listener}: answered 400 to 1 malformed "
        "request" in lines[0]
    )


@pytest.fixture
def store_process(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """``agentd store`` as one of two candidates (the other never starts)."""
    err = tmp_path / "store.err"
    port = free_port()
    peers = f"127.0.0.1:{port},127.0.0.1:{free_port()}"
    with open(err, "wb") as fp:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agentd", "store", "--port", str(port), "--peers", peers],
            stderr=fp,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env={"AGENTD_STORE_TOKEN": "tok", "PATH": "/usr/bin:/bin"},
        )
    try:
        wait_until(lambda: "Store listening" in err.read_text(), what="the store to listen")
        yield proc, err
    finally:
        proc.kill()
        proc.wait()


def test_a_candidate_store_answers_garbage_400_with_one_warning(store_process):
    proc, err = store_process
    port = int(re.search(r"Store listening on http://127\.0\.0\.1:(\d+)", err.read_text())[1])
    assert {send(port, request) for request in MALFORMED} == {b"HTTP/1.1 400 Bad Request"}
    assert proc.poll() is None
    assert_one_warning_per_listener(err.read_text(), "store")


def test_the_health_port_answers_garbage_400_with_one_warning(run_agentd, tmp_path):
    stop = tmp_path / "stop"
    agent = run_agentd("--health-port", "0", WORKER, "member", "--stop-file", str(stop))
    url = wait_until(
        lambda: re.search(r"Health endpoint on http://127\.0\.0\.1:(\d+)", agent.stderr()),
        what="the health endpoint",
    )
    port = int(url[1])  # type: ignore[index]
    assert {send(port, request) for request in MALFORMED} == {b"HTTP/1.0 400 Bad Request"}
    stop.touch()
    assert agent.wait(30) == 0
    assert_one_warning_per_listener(agent.stderr(), "health_port")


BAD_HEADERS = [
    b"Host: x\r\nAuthorization: Bearer \xff\xfe\xc3",  # not UTF-8 where the token goes
    b"Host: x\r\nX-Trace: caf\xe9",  # in another header (Latin-1)
    b"Host: h\xf0\x28\x8c\x28",  # in Host (a broken 4-byte sequence)
]
STORE_ROUTES = [f"/v1/{op}" for op in sorted({*OPS, *CANDIDATE_OPS})] + ["/v1/nope", "/"]
HEALTH_ROUTES = ["/livez", "/healthz", "/readyz", "/status", "/metrics", "/drain", "/nope"]


def bad_header_requests(routes: list[str]) -> Iterator[bytes]:
    """Every route, by GET and by POST, with bytes that are not UTF-8 in each place."""
    for path in routes:
        for method in (b"GET", b"POST"):
            for headers in BAD_HEADERS:
                yield (
                    method
                    + b" "
                    + path.encode()
                    + b" HTTP/1.1\r\n"
                    + headers
                    + b"\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}"
                )


def assert_all_4xx(port: int, routes: list[str]) -> None:
    answers = {request: send(port, request) for request in bad_header_requests(routes)}
    wrong = {req: status for req, status in answers.items() if not status.startswith(b"HTTP/1.1 4")}
    assert not wrong, wrong


def assert_at_most_one_warning(err: str, listeners: list[str]) -> None:
    assert "Traceback" not in err and "ERROR" not in err, err[-3000:]
    for listener in listeners:
        lines = [line for line in err.splitlines() if f"{listener}: answered 400" in line]
        assert len(lines) <= 1, lines


@pytest.mark.parametrize("peers", [False, True], ids=["agentd-store", "candidate-store"])
def test_header_bytes_that_are_not_utf8_get_a_4xx_from_every_store_route(run_store, peers):
    port = free_port()
    store = run_store(port, peers=f"127.0.0.1:{port},127.0.0.1:{free_port()}" if peers else "")
    assert_all_4xx(port, STORE_ROUTES)
    assert store.proc.poll() is None
    store.proc.kill()
    store.proc.wait()
    err = store.err.read_text()
    assert_at_most_one_warning(err, ["store"])
    assert "header Authorization: its value is not valid UTF-8" in err


def test_header_bytes_that_are_not_utf8_get_a_4xx_from_the_agents_listeners(run_agentd, tmp_path):
    """One agent serves both: its health port (with ``POST /drain``) and the job's store."""
    stop = tmp_path / "stop"
    store, health = free_port(), free_port()
    agent = run_agentd(
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{store}",
        "--nnodes",
        "1",
        "--health-port",
        str(health),
        "--drain-on",
        "SIGUSR1",
        WORKER,
        "member",
        "--stop-file",
        str(stop),
        env={"AGENTD_STORE_TOKEN": "tok"},
    )
    wait_until(lambda: "Started 1 worker" in agent.stderr(), what="the worker to start")
    assert_all_4xx(health, HEALTH_ROUTES)
    assert_all_4xx(store, STORE_ROUTES)
    stop.touch()
    assert agent.wait(30) == 0
    assert_at_most_one_warning(agent.stderr(), ["health_port", "store"])
