"""Reaching etcd from ``--rdzv-endpoint`` and ``--rdzv-conf``: members, TLS, auth, prefix.

Everything is checked when the config is built (a bad value is one ConfigError naming the
key, the value and the rule); the connection itself opens on the first rendezvous.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agentd.exceptions import ConfigError
from agentd.store.connect import OpenedStore, StoreOpener
from agentd.support.net import split_endpoint

if TYPE_CHECKING:
    from agentd.store.etcd.store import EtcdStore

DEFAULT_PORT = 2379
PASSWORD_ENV = "AGENTD_ETCD_PASSWORD"
"""Where the etcd password may come from instead of ``--rdzv-conf`` (which ``ps`` shows)."""
_TORCH_ALIASES = {"ca_cert": "cacert", "ssl_cert": "cert", "ssl_cert_key": "key"}
"""torch's etcd-v2 backend names for the TLS keys."""


@dataclass(frozen=True)
class EtcdSettings:
    """How to reach one etcd cluster."""

    urls: tuple[str, ...]
    hosts: tuple[str, ...]
    key_prefix: str = ""
    ssl_context: ssl.SSLContext | None = None
    username: str | None = None
    password: str | None = None
    request_timeout: float = 10.0
    tls_files: tuple[str | None, str | None, str | None] | None = None
    """The TLS files (``cacert``, ``cert``, ``key``) the context was made of: another
    process (a killed agent's guardian) makes its own from them."""


def etcd_settings(
    endpoints: str,
    conf: dict[str, str],
    request_timeout: float = 10.0,
    env: Mapping[str, str] = os.environ,
) -> EtcdSettings:
    """Parse ``host:port[,host:port...]`` and take etcd's keys out of ``conf``."""
    for alias, name in _TORCH_ALIASES.items():
        if alias in conf:
            conf.setdefault(name, conf.pop(alias))
    cacert, cert, key = (conf.pop(k, "") or None for k in ("cacert", "cert", "key"))
    protocol = conf.pop("protocol", "") or None
    if protocol is not None and protocol not in ("http", "https"):
        raise ConfigError(f"--rdzv-conf: protocol={protocol!r} must be http or https")
    hosts, urls = [], []
    for item in endpoints.split(","):
        text = item.strip()
        scheme, sep, rest = text.partition("://")
        if sep:
            if scheme not in ("http", "https"):
                raise ConfigError(
                    f"--rdzv-endpoint: {text!r} must be host:port or http(s)://host:port"
                )
            if protocol not in (None, scheme):
                raise ConfigError(
                    f"--rdzv-endpoint: {text!r} disagrees with --rdzv-conf protocol={protocol}"
                )
            protocol, text = scheme, rest.rstrip("/")
        host, port = split_endpoint(text, default_port=DEFAULT_PORT)
        hosts.append(host)
        urls.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    if protocol is None:
        protocol = "https" if (cacert or cert) else "http"
    if protocol == "http" and (cacert or cert or key):
        name = "cacert" if cacert else "cert" if cert else "key"
        raise ConfigError(f"--rdzv-conf: {name} needs protocol=https (TLS), not http")
    context = _ssl_context(cacert, cert, key) if protocol == "https" else None
    username = conf.pop("username", None) or None
    password = conf.pop("password", None) or env.get(PASSWORD_ENV) or None
    if password and not username:
        raise ConfigError("--rdzv-conf: password needs username= too")
    if username and not password:
        raise ConfigError(f"--rdzv-conf: username={username!r} needs password= (or {PASSWORD_ENV})")
    return EtcdSettings(
        urls=tuple(f"{protocol}://{u}" for u in urls),
        hosts=tuple(hosts),
        key_prefix=conf.pop("key_prefix", ""),
        ssl_context=context,
        username=username,
        password=password,
        request_timeout=request_timeout,
        tls_files=(cacert, cert, key) if context is not None else None,
    )


def _ssl_context(cacert: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    if key and not cert:
        raise ConfigError(f"--rdzv-conf: key={key!r} needs cert= (the client certificate)")
    for name, path in (("cacert", cacert), ("cert", cert), ("key", key)):
        if path and not os.path.isfile(path):
            raise ConfigError(f"--rdzv-conf: {name}={path!r} must be a readable file")
    try:
        context = ssl.create_default_context(cafile=cacert)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"--rdzv-conf: cacert={cacert!r} is not a PEM CA bundle: {exc}") from exc
    if cert:
        try:
            context.load_cert_chain(cert, key)
        except (ssl.SSLError, OSError) as exc:
            raise ConfigError(
                f"--rdzv-conf: cert={cert!r} (key={key!r}) is not a PEM "
                f"certificate and its key: {exc}"
            ) from exc
    return context


def etcd_store_opener(settings: EtcdSettings, retry_timeout: float = 30.0) -> StoreOpener:
    """Open an :class:`~agentd.store.etcd.store.EtcdStore` and check that the cluster answers, so
    an unreachable cluster or refused credentials fail the first rendezvous clearly."""

    async def open_store() -> OpenedStore:
        from agentd.store.etcd.store import EtcdStore

        store = EtcdStore(
            settings.urls,
            prefix=settings.key_prefix,
            ssl_context=settings.ssl_context,
            username=settings.username,
            password=settings.password,
            retry_timeout=retry_timeout,
            request_timeout=settings.request_timeout,
        )
        try:
            await store.revision()
        except BaseException:
            await store.close()
            raise
        return OpenedStore(
            store,
            store.close,
            remote=True,
            where=store.where,
            client_spec=lambda: etcd_client_spec(settings),
        )

    return open_store


def etcd_client_spec(settings: EtcdSettings) -> dict[str, Any]:
    """What :func:`etcd_client_from_spec` needs to reach the cluster from another process: a
    killed agent's guardian, which releases its membership (JSON; it holds the password,
    so it is only ever passed on a private pipe, as the embedded store's token is)."""
    return {
        "kind": "etcd",
        "urls": list(settings.urls),
        "prefix": settings.key_prefix,
        "tls": list(settings.tls_files) if settings.tls_files else None,
        "username": settings.username,
        "password": settings.password,
    }


def etcd_client_from_spec(spec: dict[str, Any], timeout: float) -> EtcdStore:
    """A client of the cluster :func:`etcd_client_spec` describes, giving up after
    ``timeout``."""
    from agentd.store.etcd.store import EtcdStore

    files = spec.get("tls")
    context = _ssl_context(*files) if files else None
    return EtcdStore(
        spec["urls"],
        prefix=spec.get("prefix") or "",
        ssl_context=context,
        username=spec.get("username"),
        password=spec.get("password"),
        retry_timeout=timeout,
        request_timeout=timeout / 2,
    )
