"""The rendezvous ``agentd run`` asks for: backend, store and settings from a
:class:`RendezvousRequest` (the rendezvous options of the resolved config, or of torch's
``RendezvousParameters``).

Everything is checked here, before anything starts; each problem is one ConfigError naming
the flag, the value and the rule.
"""

from __future__ import annotations

import dataclasses
import socket
from typing import TYPE_CHECKING, NamedTuple

from agentd.exceptions import ConfigError
from agentd.rendezvous.api import RendezvousHandler

if TYPE_CHECKING:
    from agentd.rendezvous.conf import RendezvousSettings
    from agentd.rendezvous.dynamic import DynamicRendezvous
    from agentd.rendezvous.host_memory import RoundKeeper
    from agentd.rendezvous.solo import SoloRendezvous
    from agentd.rendezvous.static import StaticRendezvous
    from agentd.store.connect import StoreOpener
    from agentd.store.tls import StoreTls

TORCHRUN_MASTER_PORT = 29500
_ALIASES = {"c10d": "agentd", "etcd-v2": "etcd"}
"""torchrun's backend names, and the backend each one runs here (what /status reports)."""
_RETRY_TIMEOUT = 30.0
"""How long store requests are retried, at most: the join timeout if shorter."""
_IGNORED_TORCH_KEYS = ("use_libuv", "store_type")
"""torch ``--rdzv-conf`` keys about its TCPStore, which mean nothing here."""


class RendezvousRequest(NamedTuple):
    """The rendezvous options, as ``agentd run`` names them (``--rdzv-backend`` ...)."""

    nnodes: tuple[int, int] = (1, 1)
    rdzv_backend: str = "static"
    rdzv_endpoint: str = ""
    rdzv_conf: str = ""
    standalone: bool = False
    node_rank: int = 0
    local_addr: str | None = None
    master_addr: str | None = None
    master_port: int = 0
    role: str = "default"
    store_token: str | None = None
    log_dir: str | None = None
    """Where the store's host keeps its last round across its own restart (see
    :mod:`agentd.rendezvous.host_memory`; None: the temporary directory)."""


def build_rendezvous(
    request: RendezvousRequest, run_id: str, local_world_size: int
) -> RendezvousHandler:
    """The rendezvous handler for ``request``."""
    low, high = request.nnodes
    conf: dict[str, str] = {}
    if request.rdzv_conf:  # none given: no parser, and no key to check
        from agentd.rendezvous.conf import parse_rdzv_conf

        conf = parse_rdzv_conf(request.rdzv_conf)
    if request.standalone:
        if (low, high) != (1, 1):
            raise ConfigError(
                f"--nnodes: '{low}:{high}' cannot be combined with --standalone "
                "(one node; use --rdzv-backend agentd for several)"
            )
        return _solo(request, run_id, conf)
    backend = request.rdzv_backend
    if backend == "static":
        return _static(request, run_id, local_world_size, conf)
    if backend in ("etcd", "etcd-v2"):
        return _etcd(request, run_id, local_world_size, conf)
    return _dynamic(request, run_id, local_world_size, conf)


def _solo(request: RendezvousRequest, run_id: str, conf: dict[str, str]) -> SoloRendezvous:
    from agentd.rendezvous.solo import SoloRendezvous

    if conf:
        from agentd.rendezvous.conf import reject_unknown, settings_from_conf

        settings_from_conf(conf, (1, 1))  # the keys are checked, though one node meets no one
        reject_unknown(conf, "agentd")
    return SoloRendezvous(run_id, request.local_addr or "127.0.0.1", request.master_port or None)


def static_master(request: RendezvousRequest) -> tuple[str, int]:
    """Where a static job's workers meet (0: a free port, for one node): torchrun's rule,
    ``--rdzv-endpoint`` when given (a host alone takes ``--master-port``, else 29500),
    else ``--master-addr`` and ``--master-port``."""
    if request.rdzv_endpoint:
        from agentd.support.net import split_endpoint

        return split_endpoint(
            request.rdzv_endpoint, default_port=request.master_port or TORCHRUN_MASTER_PORT
        )
    return request.master_addr or "127.0.0.1", request.master_port


def _static(
    request: RendezvousRequest, run_id: str, local_world_size: int, conf: dict[str, str]
) -> StaticRendezvous:
    low, high = request.nnodes
    if low != high:
        raise ConfigError(
            f"--nnodes: '{low}:{high}' needs an elastic backend "
            "(--rdzv-backend agentd); static takes a fixed N"
        )
    if not 0 <= request.node_rank < low:
        raise ConfigError(
            f"--node-rank: {request.node_rank!r} must be within 0..{low - 1} (--nnodes {low})"
        )
    timeout = None
    if conf:
        from agentd.rendezvous.conf import pop_seconds, reject_unknown

        timeout = pop_seconds(conf, "timeout")  # the wait for node 0's store and the others
        reject_unknown(conf, "static")
    addr, port = static_master(request)
    if low == 1:  # meets nobody; its agent serves the workers' store, as torchrun's does
        from agentd.rendezvous.solo import SoloRendezvous

        flag = "--rdzv-endpoint" if request.rdzv_endpoint else "--master-addr"
        return SoloRendezvous(run_id, addr, port or None, backend="static", addr_flag=flag)
    from agentd.rendezvous.static_nodes import DEFAULT_TIMEOUT, StaticNodesRendezvous

    return StaticNodesRendezvous(
        run_id,
        addr,
        port or TORCHRUN_MASTER_PORT,
        node_rank=request.node_rank,
        nnodes=low,
        role=request.role,
        local_world_size=local_world_size,
        timeout=timeout or DEFAULT_TIMEOUT,
        local_addr=request.local_addr,
    )


def _dynamic(
    request: RendezvousRequest, run_id: str, local_world_size: int, conf: dict[str, str]
) -> DynamicRendezvous:
    from agentd.rendezvous.conf import pop_bool, pop_seconds
    from agentd.store.connect import http_store_opener
    from agentd.support.net import is_loopback, serves_here, split_endpoint

    if not request.rdzv_endpoint:
        raise ConfigError(
            f"--rdzv-endpoint: required by --rdzv-backend {request.rdzv_backend} "
            "(host:port of the store), or use --standalone"
        )
    if "," in request.rdzv_endpoint:
        return _candidates(request, run_id, local_world_size, conf)
    host, port = split_endpoint(request.rdzv_endpoint)
    is_host = pop_bool(conf, "is_host")
    if is_host is None:
        is_host = serves_here(host, request.local_addr)
    standby = pop_bool(conf, "standby") is not False
    read_timeout = pop_seconds(conf, "read_timeout") or 10.0
    token = request.store_token
    if is_host and not token and not is_loopback(host):  # before a warning about the token
        raise ConfigError(
            f"--store-token: required to host the store on {host!r}, which is not loopback "
            "(set AGENTD_STORE_TOKEN on every node)"
        )
    tls = _tls(conf, [host], serves=is_host or standby)
    settings = _rendezvous_settings(request, conf)
    if port == 0 and not is_host:
        raise ConfigError(
            f"--rdzv-endpoint: {request.rdzv_endpoint!r}: port 0 only works "
            "on the host that serves the store"
        )
    addr = request.local_addr or ("127.0.0.1" if is_loopback(host) else socket.getfqdn())
    # once members stand by, a frozen server must be left for another in time (TTL)
    opener = http_store_opener(
        host,
        port,
        token,
        is_host,
        request_timeout=read_timeout,
        failover_request_timeout=min(read_timeout, settings.heartbeat_ttl / 3),
        retry_timeout=min(_RETRY_TIMEOUT, settings.join_timeout),
        workers=local_world_size,
        standby=standby,
        standby_host=request.local_addr or "",
        tls=tls,
    )
    keeper = None
    if is_host and port:  # a restart here comes back at the endpoint with an empty store
        from agentd.rendezvous.host_memory import file_keeper

        keeper = file_keeper(request.log_dir, run_id, port)
    return _handler(request, run_id, local_world_size, opener, settings, addr, keeper)


def _candidates(
    request: RendezvousRequest, run_id: str, local_world_size: int, conf: dict[str, str]
) -> DynamicRendezvous:
    """The embedded store, served by one of several candidates, failing over among them."""
    from agentd.rendezvous.conf import pop_bool, pop_seconds
    from agentd.store.candidates import parse_candidates
    from agentd.store.connect import candidates_opener
    from agentd.support.net import is_loopback

    endpoints = parse_candidates(request.rdzv_endpoint)
    is_host = pop_bool(conf, "is_host")
    read_timeout = pop_seconds(conf, "read_timeout") or 10.0
    tls = _tls(conf, [host for host, _ in endpoints], serves=is_host is not False)
    settings = _rendezvous_settings(request, conf)
    if not request.store_token:
        raise ConfigError(
            f"--store-token: required with several --rdzv-endpoint candidates "
            f"({request.rdzv_endpoint!r}): they and every agent share it "
            "(set AGENTD_STORE_TOKEN on every node)"
        )
    # a frozen server must be left for another in time to keep our lease (TTL)
    request_timeout = min(read_timeout, settings.heartbeat_ttl / 3)
    local = all(is_loopback(host) for host, _ in endpoints)
    addr = request.local_addr or ("127.0.0.1" if local else socket.getfqdn())
    # each try names every candidate and why it does not serve; the join timeout ends it
    opener = candidates_opener(
        endpoints,
        request.store_token,
        is_host,
        retry_timeout=min(_RETRY_TIMEOUT, settings.join_timeout / 2),
        request_timeout=request_timeout,
        workers=local_world_size,
        tls=tls,
        own_host=request.local_addr,
    )
    return _handler(request, run_id, local_world_size, opener, settings, addr)


def _etcd(
    request: RendezvousRequest, run_id: str, local_world_size: int, conf: dict[str, str]
) -> DynamicRendezvous:
    """The same rendezvous, on an etcd cluster: the agents are all its clients."""
    from agentd.rendezvous.conf import pop_seconds
    from agentd.store.etcd.connect import etcd_settings, etcd_store_opener
    from agentd.support.net import is_loopback

    if not request.rdzv_endpoint:
        raise ConfigError(
            f"--rdzv-endpoint: required by --rdzv-backend {request.rdzv_backend} "
            "(host:port[,host:port...] of etcd's members)"
        )
    read_timeout = pop_seconds(conf, "read_timeout") or 10.0
    etcd = etcd_settings(request.rdzv_endpoint, conf, read_timeout)
    settings = _rendezvous_settings(request, conf)
    if len(etcd.urls) > 1:  # a stalled member must be left for another within the lease
        timeout = min(read_timeout, settings.heartbeat_ttl / 3)
        etcd = dataclasses.replace(etcd, request_timeout=timeout)
    local = all(is_loopback(host) for host in etcd.hosts)
    addr = request.local_addr or ("127.0.0.1" if local else socket.getfqdn())
    opener = etcd_store_opener(etcd, retry_timeout=min(_RETRY_TIMEOUT, settings.join_timeout))
    return _handler(request, run_id, local_world_size, opener, settings, addr)


def _tls(conf: dict[str, str], hosts: list[str], serves: bool) -> StoreTls | None:
    """The store's TLS from ``--rdzv-conf`` (None: plain HTTP, said once when off
    loopback). ``serves``: this agent may serve the store, so its certificate must."""
    from agentd.store.tls import tls_from_conf, warn_clear_token

    tls = tls_from_conf(conf, serve=serves)
    if tls is None:
        warn_clear_token(hosts, "add --rdzv-conf cacert=CA.pem,cert=NODE.pem,key=NODE.key")
    return tls


def _rendezvous_settings(request: RendezvousRequest, conf: dict[str, str]) -> RendezvousSettings:
    """The rendezvous keys, once the backend took its own; any key left is an error."""
    from agentd.rendezvous.conf import reject_unknown, settings_from_conf

    settings = settings_from_conf(conf, request.nnodes, request.rdzv_backend in ("etcd", "etcd-v2"))
    for key in _IGNORED_TORCH_KEYS:
        conf.pop(key, None)
    reject_unknown(conf, request.rdzv_backend)
    return settings


def _handler(
    request: RendezvousRequest,
    run_id: str,
    local_world_size: int,
    open_store: StoreOpener,
    settings: RendezvousSettings,
    addr: str,
    keeper: RoundKeeper | None = None,
) -> DynamicRendezvous:
    from agentd.rendezvous.dynamic import DynamicRendezvous

    return DynamicRendezvous(
        run_id,
        open_store,
        settings,
        role=request.role,
        local_world_size=local_world_size,
        addr=addr,
        master_port=request.master_port or None,
        backend=_ALIASES.get(request.rdzv_backend, request.rdzv_backend),
        keeper=keeper,
    )
