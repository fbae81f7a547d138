"""Real etcd servers for tests and benchmarks: a cluster of members on free loopback ports,
each with a temporary data dir and fast elections, stopped by pid.

Needs the ``etcd`` binary (Debian's ``etcd-server``); :func:`etcd_binary` says where it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import free_port, wait_until


def etcd_binary() -> str | None:
    """The etcd server binary, or None when it is not installed."""
    return shutil.which("etcd")


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.client_port}"

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


@dataclass
class EtcdCluster:
    """``size`` etcd members under ``root``; use as a context manager, or start/stop."""

    root: Path
    size: int = 1
    members: list[EtcdMember] = field(default_factory=list)

    def __post_init__(self) -> None:
        for index in range(self.size):
            name = f"m{index}"
            self.members.append(EtcdMember(name, free_port(), free_port(), self.root / name,
                                           self.root / f"{name}.log"))  # fmt: skip

    @property
    def endpoints(self) -> str:
        """``host:port,...`` as ``--rdzv-endpoint`` takes it."""
        return ",".join(m.endpoint for m in self.members)

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self, timeout: float = 20.0) -> EtcdCluster:
        binary = etcd_binary()
        if binary is None:
            raise RuntimeError("etcd is not installed (Debian package etcd-server)")
        self.root.mkdir(parents=True, exist_ok=True)
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        token = f"agentd-test-{os.getpid()}-{time.monotonic_ns()}"
        for member in self.members:
            argv = [
                binary, "--name", member.name, "--data-dir", str(member.data_dir),
                "--listen-client-urls", member.url, "--advertise-client-urls", member.url,
                "--listen-peer-urls", member.peer_url,
                "--initial-advertise-peer-urls", member.peer_url,
                "--initial-cluster", initial, "--initial-cluster-token", token,
                "--initial-cluster-state", "new",
                "--heartbeat-interval", "10", "--election-timeout", "100",
                "--logger", "zap", "--log-level", "warn",
            ]  # fmt: skip
            with open(member.log, "ab") as log:
                member.proc = subprocess.Popen(argv, stdout=log, stderr=log,
                                               stdin=subprocess.DEVNULL)  # fmt: skip
        try:
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def wait_healthy(self, timeout: float = 20.0) -> None:
        """Wait until every running member answers ``/health`` with a leader."""
        for member in self.members:
            if member.proc is not None and member.proc.poll() is None:
                wait_until(lambda m=member: _healthy(m), timeout,  # type: ignore[misc]
                           what=f"etcd {member.name} healthy ({_tail(member.log)})")  # fmt: skip

    def kill(self, index: int) -> None:
        """SIGKILL one member (its data dir stays)."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            member.proc.kill()
            member.proc.wait()

    def stop(self) -> None:
        for index in range(len(self.members)):
            self.kill(index)

    def __enter__(self) -> EtcdCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def etcd_call(url: str, path: str, body: dict[str, object], token: str | None = None) -> dict:
    """One JSON request to an etcd gateway (for fixtures: users, compaction)."""
    request = urllib.request.Request(url + path, json.dumps(body).encode(), method="POST")
    if token:
        request.add_header("Authorization", token)
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def _healthy(member: EtcdMember) -> bool:
    if member.proc is None or member.proc.poll() is not None:
        raise AssertionError(f"etcd {member.name} exited: {_tail(member.log)}")
    with (
        contextlib.suppress(OSError, ValueError),
        urllib.request.urlopen(member.url + "/health", timeout=2) as response,
    ):
        return json.loads(response.read()).get("health") == "true"
    return False


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-1500:]
    except OSError:
        return ""
