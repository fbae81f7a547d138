"""Real etcd servers for tests and benchmarks: a cluster of members on free loopback ports,
each with a temporary data dir and fast elections, stopped by pid.

Needs the ``etcd`` binary (Debian's ``etcd-server``); :func:`etcd_binary` says where it is.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import ssl
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from tests.conftest import free_port, wait_until


def etcd_binary() -> str | None:
    """The etcd server binary, or None when it is not installed."""
    return shutil.which("etcd")


def require_etcd() -> None:
    """Skip a test that needs etcd where it is not installed; in CI, fail it instead (a
    skipped backend would pass unseen)."""
    if etcd_binary() is None:
        message = "etcd is not installed (Debian package etcd-server)"
        if os.environ.get("CI"):
            pytest.fail(message + "; .ci/run installs it")
        pytest.skip(message)


@dataclass(frozen=True)
class TlsFiles:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context(cafile=str(self.ca))
        context.load_cert_chain(str(self.client_cert), str(self.client_key))
        return context


def make_tls(folder: Path) -> TlsFiles:
    """Make :class:`TlsFiles` in ``folder`` with the openssl command."""
    folder.mkdir(parents=True, exist_ok=True)

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)

    openssl(
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=agentd test CA",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    )
    for name, extension in (
        ("server", "subjectAltName=IP:127.0.0.1,DNS:localhost"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        openssl(
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            f"/CN=agentd test {name}",
            "-keyout",
            f"{name}.key",
            "-out",
            f"{name}.csr",
        )
        (folder / f"{name}.ext").write_text(extension + "\n")
        openssl(
            "x509",
            "-req",
            "-in",
            f"{name}.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            f"{name}.ext",
            "-out",
            f"{name}.pem",
        )
    return TlsFiles(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server.key",
        folder / "client.pem",
        folder / "client.key",
    )


@dataclass
class EtcdMember:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    scheme: str = "http"
    host: str = "127.0.0.1"
    """The address clients reach it on (its peers always meet on 127.0.0.1)."""
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{self.scheme}://{self.host}:{self.client_port}"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"


class MemberExited(AssertionError):
    """An etcd member exited while the cluster started; names it and quotes its log."""

    def __init__(self, member: EtcdMember) -> None:
        log = _tail(member.log)
        code = member.proc.returncode if member.proc is not None else None
        super().__init__(
            f"etcd {member.name} (client port {member.client_port}, peer port "
            f"{member.peer_port}) exited with {code}; its log {member.log}: {log}"
        )
        self.lost_port = "address already in use" in log


@dataclass
class EtcdCluster:
    """``size`` etcd members under ``root``; use as a context manager, or start/stop.

    With ``tls``, clients must speak https and show a certificate the CA signed; ``host``
    is the address clients reach the members on (a bridge's, for hosts in network
    namespaces)."""

    root: Path
    size: int = 1
    tls: TlsFiles | None = None
    host: str = "127.0.0.1"
    extra_args: tuple[str, ...] = ()
    members: list[EtcdMember] = field(default_factory=list)
    _token: str = ""

    def __post_init__(self) -> None:
        scheme = "https" if self.tls else "http"
        for index in range(self.size):
            name = f"m{index}"
            self.members.append(
                EtcdMember(
                    name,
                    free_port(),
                    free_port(),
                    self.root / name,
                    self.root / f"{name}.log",
                    scheme,
                    self.host,
                )
            )

    def _new_ports(self) -> None:
        """Give every member fresh ports and an empty data dir (a member lost its port)."""
        for member in self.members:
            member.client_port, member.peer_port = free_port(), free_port()
            shutil.rmtree(member.data_dir, ignore_errors=True)
            member.log.unlink(missing_ok=True)

    @property
    def endpoints(self) -> str:
        """``host:port,...`` as ``--rdzv-endpoint`` takes it."""
        return ",".join(m.endpoint for m in self.members)

    @property
    def urls(self) -> list[str]:
        return [m.url for m in self.members]

    def start(self, timeout: float = 20.0, tries: int = 3) -> EtcdCluster:
        """Start every member and wait until each is healthy.

        Ports come from :func:`free_port`, which cannot hold them until etcd binds them: a
        member that finds its port taken ("address already in use") makes the whole
        cluster start again on new ports (the peers' URLs are in every member's flags).
        Any other exit fails at once, naming the member and its log.
        """
        for attempt in range(tries):
            try:
                self._launch()
                self.wait_healthy(timeout)
            except MemberExited as exc:
                self.stop()
                if not exc.lost_port or attempt == tries - 1:
                    raise
                self._new_ports()
            except BaseException:
                self.stop()
                raise
            else:
                return self
        raise AssertionError("unreachable")

    def _launch(self) -> None:
        if etcd_binary() is None:
            raise RuntimeError("etcd is not installed (Debian package etcd-server)")
        self.root.mkdir(parents=True, exist_ok=True)
        self._token = f"agentd-test-{os.getpid()}-{time.monotonic_ns()}"
        for member in self.members:
            self._launch_member(member)

    def _launch_member(self, member: EtcdMember) -> None:
        """Start one member; one whose data dir exists rejoins with what it holds (etcd then
        ignores the initial-cluster flags)."""
        initial = ",".join(f"{m.name}={m.peer_url}" for m in self.members)
        argv = [
            str(etcd_binary()),
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            member.url,
            "--advertise-client-urls",
            member.url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            initial,
            "--initial-cluster-token",
            self._token,
            "--initial-cluster-state",
            "new",
            "--heartbeat-interval",
            "10",
            "--election-timeout",
            "100",
            "--logger",
            "zap",
            "--log-level",
            "warn",
            *self.extra_args,
        ]
        if self.tls is not None:
            argv += [
                "--cert-file",
                str(self.tls.server_cert),
                "--key-file",
                str(self.tls.server_key),
                "--trusted-ca-file",
                str(self.tls.ca),
                "--client-cert-auth",
            ]
        with open(member.log, "ab") as log:
            member.proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)

    def wait_healthy(self, timeout: float = 20.0) -> None:
        """Wait until every started member answers ``/health`` with a leader; a member that
        exited raises :class:`MemberExited` (never skipped: a cluster short of a member
        fails later, and less clearly)."""
        for member in self.members:
            if member.proc is not None:
                wait_until(
                    lambda m=member: self._healthy(m),
                    timeout,  # type: ignore[misc]
                    what=f"etcd {member.name} healthy ({_tail(member.log)})",
                )

    def _healthy(self, member: EtcdMember) -> bool:
        if member.proc is None or member.proc.poll() is not None:
            raise MemberExited(member)
        context = self.tls.client_context() if self.tls else None
        with (
            contextlib.suppress(OSError, ValueError),
            urllib.request.urlopen(member.url + "/health", timeout=2, context=context) as answer,
        ):
            return json.loads(answer.read()).get("health") == "true"
        return False

    def kill(self, index: int) -> None:
        """SIGKILL one member (its data dir stays)."""
        member = self.members[index]
        if member.proc is not None and member.proc.poll() is None:
            member.proc.kill()
            member.proc.wait()

    def stall(self, index: int) -> None:
        """SIGSTOP member ``index`` (a stalled disk, a paused VM: it takes connections and
        answers nothing), and wait until its process is seen stopped."""
        member = self.members[index]
        assert member.proc is not None
        stopped = psutil.Process(member.proc.pid)
        stopped.suspend()
        wait_until(lambda: stopped.status() == psutil.STATUS_STOPPED, what="the stall")

    def resume(self, index: int) -> None:
        """SIGCONT member ``index``, if it runs (a member killed meanwhile is gone, and one
        restarted since was never stopped)."""
        proc = self.members[index].proc
        if proc is not None and proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def stalled(self, index: int) -> Iterator[None]:
        """Member ``index`` stalled (:meth:`stall`) within, and going on after."""
        self.stall(index)
        try:
            yield
        finally:
            self.resume(index)

    def restart(self, *indexes: int, timeout: float = 20.0) -> None:
        """Start killed members again on their ports and data dirs; wait until healthy."""
        for index in indexes:
            member = self.members[index]
            if member.proc is not None and member.proc.poll() is None:
                raise RuntimeError(f"etcd {member.name} is still running")
            self._launch_member(member)
        self.wait_healthy(timeout)

    def leader(self) -> int:
        """The index of the member that leads, as the running members see it."""
        running = [
            i for i, m in enumerate(self.members) if m.proc is not None and m.proc.poll() is None
        ]
        statuses = {
            i: etcd_call(self.members[i].url, "/v3/maintenance/status", {}) for i in running
        }
        leader = statuses[running[0]]["leader"]
        return next(i for i, s in statuses.items() if s["header"]["member_id"] == leader)

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


def _tail(path: Path) -> str:
    try:
        return path.read_text(errors="replace")[-1500:]
    except OSError:
        return ""
