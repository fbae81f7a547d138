"""A single-member etcd server on loopback, for tests and trials (torch's ``EtcdServer``).

``EtcdServer(data_dir=None).start()`` runs the ``etcd`` binary (``$TORCHELASTIC_ETCD_BINARY_PATH``
or ``etcd`` on PATH) on free 127.0.0.1 ports with a fresh data directory, and returns once
it answers; ``get_endpoint()`` is ``host:port`` for ``--rdzv-endpoint``; ``stop()`` stops
it by pid and removes the data directory it made. Not for production: one member, no TLS.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

from agentd.exceptions import StartError
from agentd.support.secrets import child_env

BINARY_ENV = "TORCHELASTIC_ETCD_BINARY_PATH"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class EtcdServer:
    """One etcd member for a test or a trial (see the module)."""

    def __init__(self, data_dir: str | None = None) -> None:
        self._given_dir = data_dir
        self._data_dir = data_dir or ""
        self._host = "127.0.0.1"
        self._port = -1
        self._proc: subprocess.Popen[bytes] | None = None

    def get_host(self) -> str:
        return self._host

    def get_port(self) -> int:
        return self._port

    def get_endpoint(self) -> str:
        return f"{self._host}:{self._port}"

    def start(self, timeout: float = 60, num_retries: int = 3, stderr: int | None = None) -> None:
        """Start and wait until it answers; a port taken meanwhile is retried."""
        binary = os.environ.get(BINARY_ENV) or shutil.which("etcd")
        if not binary:
            raise StartError(f"etcd: no binary (install etcd, or set {BINARY_ENV})")
        for attempt in range(num_retries):
            self._data_dir = self._given_dir or tempfile.mkdtemp(prefix="agentd-etcd-")
            self._port, peer = _free_port(), _free_port()
            client_url = f"http://{self._host}:{self._port}"
            self._proc = subprocess.Popen(
                [
                    binary,
                    "--enable-v2",
                    "--data-dir",
                    self._data_dir,
                    "--name",
                    "default",
                    "--listen-client-urls",
                    client_url,
                    "--advertise-client-urls",
                    client_url,
                    "--listen-peer-urls",
                    f"http://{self._host}:{peer}",
                    "--initial-advertise-peer-urls",
                    f"http://{self._host}:{peer}",
                    "--initial-cluster",
                    f"default=http://{self._host}:{peer}",
                ],
                env=child_env(),
                stdout=subprocess.DEVNULL,
                stderr=stderr or subprocess.DEVNULL,
                start_new_session=True,
            )
            if self._wait_ready(timeout):
                return
            self.stop()
            if attempt == num_retries - 1:
                raise StartError(f"etcd: did not answer on {self.get_endpoint()} within {timeout}s")

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        url = f"http://{self.get_endpoint()}/version"
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            with contextlib.suppress(OSError), urllib.request.urlopen(url, timeout=1):
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stop the server (by pid) and remove the data directory it made."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if not self._given_dir and self._data_dir:
            shutil.rmtree(self._data_dir, ignore_errors=True)
