"""Certificates made at test time with the openssl command: a job's CA, and one
certificate per node that serves and presents itself (server and client use), for the
loopback addresses the tests bind."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

SAN = "IP:127.0.0.1,IP:127.0.0.2,IP:127.0.0.3,IP:127.0.0.4,DNS:localhost"


@dataclass(frozen=True)
class NodeTls:
    """One node's files: the job's CA, its certificate and its key."""

    ca: Path
    cert: Path
    key: Path

    def conf(self) -> str:
        """The ``--rdzv-conf`` keys that give an agent this TLS."""
        return f"protocol=https,cacert={self.ca},cert={self.cert},key={self.key}"

    def flags(self) -> list[str]:
        """``agentd store``'s flags for this TLS."""
        return ["--cacert", str(self.ca), "--cert", str(self.cert), "--key", str(self.key)]


def _openssl(folder: Path, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def make_ca(folder: Path, name: str = "ca") -> Path:
    """A self-signed CA in ``folder`` (``<name>.pem``, ``<name>.key``)."""
    folder.mkdir(parents=True, exist_ok=True)
    _openssl(
        folder,
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-days",
        "2",
        "-subj",
        f"/CN=agentd test {name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.pem",
    )
    return folder / f"{name}.pem"


def node_tls(folder: Path, name: str, ca: Path, days: int = 2) -> NodeTls:
    """A certificate for node ``name`` signed by ``ca`` (``days`` < 0: already expired)."""
    _openssl(
        folder,
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-subj",
        f"/CN=agentd {name}",
        "-keyout",
        f"{name}.key",
        "-out",
        f"{name}.csr",
    )
    (folder / f"{name}.ext").write_text(
        f"subjectAltName={SAN}\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        folder,
        "x509",
        "-req",
        "-in",
        f"{name}.csr",
        "-CA",
        str(ca),
        "-CAkey",
        str(ca.with_suffix(".key")),
        "-CAcreateserial",
        "-days",
        str(days),
        "-extfile",
        f"{name}.ext",
        "-out",
        f"{name}.pem",
    )
    return NodeTls(ca, folder / f"{name}.pem", folder / f"{name}.key")
