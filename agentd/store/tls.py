"""TLS for the embedded store, its candidates and ``agentd store``.

The same keys as an etcd job's (``--rdzv-conf protocol=https,cacert=…,cert=…,key=…``; for
``agentd store``, ``--cacert --cert --key``):

- a client (every agent) verifies the store against ``cacert`` (the system's CAs without
  one) and presents ``cert``/``key`` when given;
- a server (the agent that hosts the store, a standby candidate, ``agentd store``) serves
  with ``cert``/``key``, and with ``cacert`` requires every client to present a
  certificate signed by it (mutual TLS: each node holds a certificate of the job's CA).

Everything is checked before anything starts: a missing or unreadable file, one that is
not PEM, a key that does not belong to its certificate, or a certificate the CA does not
vouch for or that has expired is a :class:`ConfigError` (exit 2) naming the key and the
file. The last two are found by a handshake in memory between this node's own server and
client contexts, with the public ``ssl`` API alone.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from agentd.exceptions import ConfigError
from agentd.support.net import is_loopback

log = logging.getLogger(__name__)

_TORCH_ALIASES = {"ca_cert": "cacert", "ssl_cert": "cert", "ssl_cert_key": "key"}
"""torch's etcd-v2 names for the same keys."""


@dataclass(frozen=True)
class StoreTls:
    """The files of one node's TLS and the contexts made from them."""

    cacert: str | None
    cert: str | None
    key: str | None
    serve: bool = True
    """This node may serve the store (it hosts it, or stands by to): its certificate must
    work as a server's, which is checked at once."""
    flags: bool = False
    """Error messages name the keys as ``agentd store``'s flags (``--cert``), not as
    ``--rdzv-conf cert=``."""
    client: ssl.SSLContext = field(init=False, repr=False, compare=False)
    """Verifies the store; presents ``cert`` when given."""
    server: ssl.SSLContext | None = field(init=False, repr=False, compare=False)
    """Serves with ``cert`` (None without one, or without ``serve``)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "client", self._client_context())
        serves = self.serve and self.cert is not None
        object.__setattr__(self, "server", self._server_context() if serves else None)

    def server_context(self, on_refused: Callable[[str], None]) -> ssl.SSLContext:
        """A server context of its own for one listener, which tells ``on_refused`` why each
        client's handshake failed (asyncio says nothing of them); a node asked to serve
        without a certificate is a :class:`ConfigError`."""
        if self.server is None:
            raise ConfigError(
                f"{self._name('cert')}: required to serve the store over TLS (with "
                f"{self._name('key')}): this node hosts the store or stands by to"
            )
        context = self._server_context(check=False)
        context.sslobject_class = _reporting(on_refused)
        return context

    # -- building and checking the contexts ------------------------------------------------

    def _name(self, key: str) -> str:
        return f"--{key} " if self.flags else f"--rdzv-conf {key}="

    def _client_context(self) -> ssl.SSLContext:
        if self.key and not self.cert:
            key, cert = self._name("key"), self._name("cert")
            raise ConfigError(f"{key}{self.key!r} needs {cert} (the certificate it belongs to)")
        for name, path in (("cacert", self.cacert), ("cert", self.cert), ("key", self.key)):
            if path is not None:
                _readable(self._name(name), path)
        try:
            context = ssl.create_default_context(cafile=self.cacert)
        except (ssl.SSLError, OSError) as exc:
            problem = f"not a PEM CA certificate ({_reason(exc)})"
            raise ConfigError(f"{self._name('cacert')}{self.cacert!r}: {problem}") from None
        if self.cert:
            self._load_chain(context)
        return context

    def _server_context(self, check: bool = True) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        self._load_chain(context)
        if self.cacert:
            context.load_verify_locations(cafile=self.cacert)
            context.verify_mode = ssl.CERT_REQUIRED
        if check:
            self._self_check(context)
        return context

    def _load_chain(self, context: ssl.SSLContext) -> None:
        try:
            context.load_cert_chain(self.cert or "", self.key)
        except (ssl.SSLError, OSError) as exc:
            problem = _reason(exc)
            if "KEY_VALUES_MISMATCH" in str(exc) or "key values mismatch" in str(exc):
                problem = "the key does not belong to the certificate"
            key = f" with {self._name('key')}{self.key!r}" if self.key else ""
            raise ConfigError(f"{self._name('cert')}{self.cert!r}{key}: {problem}") from None

    def _self_check(self, server: ssl.SSLContext) -> None:
        """A handshake in memory: this node's client against its own server, as any peer
        would make. An expired certificate, or one the CA did not sign, fails here."""
        client = self._client_context()
        client.check_hostname = False  # the name is the peers' to check, on the real address
        problem = _handshake(server, client)
        if problem:
            raise ConfigError(f"{self._name('cert')}{self.cert!r}: {problem}")


def _reporting(on_refused: Callable[[str], None]) -> type[ssl.SSLObject]:
    """The TLS object of a server's connections: a handshake that fails is told to
    ``on_refused`` (the wait for more bytes is no failure), then raised as before."""

    class Reporting(ssl.SSLObject):
        def do_handshake(self) -> None:
            try:
                super().do_handshake()
            except (ssl.SSLWantReadError, ssl.SSLWantWriteError):
                raise
            except ssl.SSLError as exc:
                on_refused(_reason(exc))
                raise

    return Reporting


def tls_from_conf(conf: dict[str, str], serve: bool = True) -> StoreTls | None:
    """Take TLS's keys out of ``conf`` (``--rdzv-conf``); None for plain HTTP.

    ``protocol=https`` or any of the files turns TLS on; ``protocol=http`` with a file is
    an error, as is any other protocol."""
    for alias, name in _TORCH_ALIASES.items():
        if alias in conf:
            conf.setdefault(name, conf.pop(alias))
    cacert, cert, key = (conf.pop(k, "") or None for k in ("cacert", "cert", "key"))
    protocol = conf.pop("protocol", "") or None
    if protocol not in (None, "http", "https"):
        raise ConfigError(f"--rdzv-conf: protocol={protocol!r} must be http or https")
    if protocol == "http" and (cacert or cert or key):
        name = "cacert" if cacert else "cert" if cert else "key"
        raise ConfigError(f"--rdzv-conf: {name} needs protocol=https (TLS), not http")
    if protocol != "https" and not (cacert or cert or key):
        return None
    return StoreTls(cacert, cert, key, serve=serve)


def _readable(name: str, path: str) -> None:
    if not os.path.isfile(path):
        raise ConfigError(f"{name}{path!r}: no such file")
    if not os.access(path, os.R_OK):
        raise ConfigError(f"{name}{path!r}: not readable by this user")


def _reason(exc: BaseException) -> str:
    """An ssl error in a few words (its reason, without OpenSSL's file and line)."""
    reason = getattr(exc, "reason", None)
    verify = getattr(exc, "verify_message", None)
    if verify:
        return str(verify)
    if reason:
        return str(reason).replace("_", " ").lower()
    return str(getattr(exc, "strerror", None) or exc)


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext) -> str:
    """Run a TLS handshake between ``server`` and ``client`` in memory; '' when it works,
    else what failed (the side that refused, and why)."""
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server_side = server.wrap_bio(server_in, server_out, server_side=True)
    client_side = client.wrap_bio(client_in, client_out, server_hostname=None)
    done = {"server": False, "client": False}
    for _ in range(20):
        for name, side in (("client", client_side), ("server", server_side)):
            if done[name]:
                continue
            try:
                side.do_handshake()
                done[name] = True
            except ssl.SSLWantReadError:
                pass
            except ssl.SSLError as exc:
                return f"{_reason(exc)}: the peers would refuse it"
        server_in.write(client_out.read())
        client_in.write(server_out.read())
        if all(done.values()):
            # TLS 1.3: the server checks the client's certificate after the client is done
            try:
                server_side.read(1)
            except ssl.SSLWantReadError:
                return ""
            except ssl.SSLError as exc:
                return f"{_reason(exc)}: the store would refuse it from a client"
            return ""
    return "the handshake did not complete"


def scheme(tls: StoreTls | None) -> str:
    """The URL scheme of a store reached with ``tls`` (None: plain HTTP)."""
    return "http" if tls is None else "https"


def warn_clear_token(hosts: list[str], hint: str) -> None:
    """One WARNING, at start, when the store's bearer token goes to or from an address off
    loopback without TLS: anyone on the path can read it, and then use the store."""
    remote = [host for host in hosts if not is_loopback(host)]
    if remote:
        log.warning(
            "The store token crosses the network in clear text (%s, no TLS): anyone "
            "on the path can read it and use the store; %s",
            ", ".join(remote),
            hint,
        )


def tls_problem(exc: BaseException) -> str:
    """A failed TLS handshake with the store, in one line (aiohttp's error, or ssl's)."""
    cause = getattr(exc, "os_error", None) or getattr(exc, "certificate_error", None) or exc
    return f"TLS handshake failed: {_reason(cause)}"
