"""``agentd store`` as a real process."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from agentd.store.http_client import HttpStore
from tests.conftest import free_port, wait_until


def stops_cleanly_on_sigterm(proc: subprocess.Popen) -> None:
    """SIGTERM the store: it exits 128+15 within 20 s."""
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=20) == 128 + signal.SIGTERM


def kill_if_alive(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def start_store(err: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    """``agentd store ARGS``, its stderr in ``err``; with the token ``tok`` unless ``env``
    says otherwise."""
    with open(err, "wb") as fp:
        return subprocess.Popen(
            [sys.executable, "-m", "agentd", "store", *args],
            stderr=fp,
            stdout=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env=env or {"AGENTD_STORE_TOKEN": "tok", "PATH": "/usr/bin:/bin"},
        )


def test_store_serves_and_stops_on_sigterm(tmp_path):
    err = tmp_path / "store.err"
    proc = start_store(err, "--port", "0")
    try:
        endpoint = wait_until(
            lambda: re.search(r"Store listening on http://(\S+)", err.read_text()),
            what="the store to listen",
        ).group(1)

        async def use() -> bytes | None:
            client = HttpStore(endpoint, token="tok")
            try:
                await client.set("job/x", b"42")
                return await client.get("job/x")
            finally:
                await client.close()

        assert asyncio.run(use()) == b"42"
        stops_cleanly_on_sigterm(proc)
        assert "Store stopped by SIGTERM" in err.read_text()
        loop = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
        assert f"Store: serving on {loop}'s event loop" in err.read_text()
    finally:
        kill_if_alive(proc)


def test_store_runs_on_the_loop_asked_for(tmp_path):
    """``--loop asyncio`` serves on asyncio's loop even where uvloop is installed."""
    err = tmp_path / "store.err"
    proc = start_store(err, "--port", "0", "--loop", "asyncio")
    try:
        wait_until(
            lambda: "Store: serving on asyncio's event loop" in err.read_text(),
            what="the store on asyncio's loop",
        )
        stops_cleanly_on_sigterm(proc)
    finally:
        kill_if_alive(proc)


def test_a_stop_signal_as_soon_as_the_store_listens_stops_it_cleanly():
    """The stop signals' handlers are in place before the store listens: a supervisor
    that sends SIGTERM the moment the port answers gets a clean stop (128+15), not a
    store killed by the signal (it had listened, and said so, before it had them)."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agentd", "store", "--port", str(port)],
        stderr=subprocess.DEVNULL,
        stdin=subprocess.DEVNULL,
        env={"AGENTD_STORE_TOKEN": "tok", "PATH": "/usr/bin:/bin"},
    )
    try:
        deadline = time.monotonic() + 30
        while True:  # the first moment it accepts a connection
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline and proc.poll() is None, "never listened"
                time.sleep(0.001)
        stops_cleanly_on_sigterm(proc)
    finally:
        kill_if_alive(proc)


def test_store_refuses_a_public_address_without_a_token():
    out = subprocess.run(
        [sys.executable, "-m", "agentd", "store", "--host", "0.0.0.0"],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin"},
    )
    assert out.returncode == 2
    assert out.stderr.startswith("agentd: error: --store-token: required when the store binds")
    assert out.stderr.count("\n") == 1


def test_overwriting_a_large_value_does_not_pin_memory(tmp_path):
    """200 overwrites of one key with 1 MiB once took the store from 47 to 251 MiB."""
    port = free_port()
    proc = start_store(tmp_path / "store.err", "--port", str(port))
    try:
        wait_until(lambda: "Store listening" in (tmp_path / "store.err").read_text())
        rss = psutil.Process(proc.pid).memory_info
        before = rss().rss

        async def overwrite() -> None:
            client = HttpStore(f"127.0.0.1:{port}", token="tok")
            try:
                for _ in range(200):
                    await client.set("big", os.urandom(1 << 20))
            finally:
                await client.close()

        asyncio.run(overwrite())
        grown = (rss().rss - before) / 2**20
        assert grown < 64, f"the store grew by {grown:.0f} MiB"
    finally:
        kill_if_alive(proc)


def store_error(*args: str, token: str = "tok") -> str:
    out = subprocess.run(
        [sys.executable, "-m", "agentd", "store", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin", **({"AGENTD_STORE_TOKEN": token} if token else {})},
    )
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    return out.stderr


def test_store_peers_are_checked_before_anything_binds():
    port = str(free_port())
    assert "--peers: '127.0.0.2:1,127.0.0.3:1' must list this store's own address " in (
        store_error("--port", port, "--peers", "127.0.0.2:1,127.0.0.3:1")
    )
    assert "lists 127.0.0.1:5 twice" in store_error(
        "--port", "5", "--peers", "127.0.0.1:5,127.0.0.1:5"
    )
    mine = f"127.0.0.1:{port},127.0.0.2:{port}"
    assert "--store-token: required with --peers" in store_error(
        "--port", port, "--peers", mine, token=""
    )


def test_a_malformed_store_host_is_a_usage_error():
    assert "--host: 'not a host!!' must be an IP address or a host name" in store_error(
        "--host", "not a host!!", "--port", "0"
    )


def test_a_store_that_cannot_listen_names_the_option_at_fault():
    """An address this host lacks is ``--host``'s, a taken port ``--port``'s (both said
    ``store: cannot listen ...``, in asyncio's words), exit 3."""

    def start_error(*args: str) -> str:
        out = subprocess.run(
            [sys.executable, "-m", "agentd", "store", *args],
            capture_output=True,
            text=True,
            timeout=30,
            env={"PATH": "/usr/bin", "AGENTD_STORE_TOKEN": "t" * 24},
        )
        assert out.returncode == 3, out.stderr
        return out.stderr

    assert "ERROR agentd: --host: '192.0.2.1' is not an address of this host (" in start_error(
        "--host", "192.0.2.1", "--port", "0"
    )
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        err = start_error("--port", str(port))
    assert (
        f"ERROR agentd: --port: cannot listen on 127.0.0.1:{port} (Address already in use)" in err
    )


def test_an_agent_with_candidates_needs_a_token():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "agentd",
            "run",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            "127.0.0.1:29400,127.0.0.2:29400",
            "--nnodes",
            "2",
            "--no-python",
            "true",
        ],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin"},
    )
    assert out.returncode == 2, out.stderr
    assert "--store-token: required with several --rdzv-endpoint candidates" in out.stderr


@pytest.mark.parametrize("stop", [signal.SIGKILL, signal.SIGTERM], ids=["sigkill", "sigterm"])
def test_a_stopped_store_leaves_no_token_file_nor_guardian(tmp_path, stop):
    """A store that made its own token publishes it for this user; killed with SIGKILL, it
    cannot withdraw it, so a guardian started with it removes the file. A clean stop
    withdraws the file itself, and its guardian exits with it."""
    runtime = tmp_path / "runtime"
    runtime.mkdir(mode=0o700)
    err = tmp_path / "store.err"
    proc = start_store(
        err, "--port", "0", env={"PATH": "/usr/bin:/bin", "XDG_RUNTIME_DIR": str(runtime)}
    )
    try:
        wait_until(lambda: "Store listening" in err.read_text(), what="the store to listen")
        [token] = (runtime / "agentd").iterdir()
        assert token.name.startswith("store-")
        [guardian] = psutil.Process(proc.pid).children()
        assert guardian.cmdline()[-2].endswith("guardian_process.py")
        proc.send_signal(stop)
        assert proc.wait(timeout=20) == (-stop if stop == signal.SIGKILL else 128 + stop)
        wait_until(lambda: not token.exists(), what="the token file to be removed")
        wait_until(lambda: exited(guardian), what="the guardian to exit")
    finally:
        kill_if_alive(proc)


def exited(proc: psutil.Process) -> bool:
    """Whether ``proc`` ended (a zombie its new parent has not reaped yet counts)."""
    try:
        return proc.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
