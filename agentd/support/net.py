"""Network addresses as agentd's flags spell them: ``host:port`` endpoints, loopback, and
whether an address belongs to this machine."""

from __future__ import annotations

import contextlib
import ipaddress
import socket

from agentd.exceptions import ConfigError


def split_endpoint(
    endpoint: str, field: str = "--rdzv-endpoint", default_port: int = 29400
) -> tuple[str, int]:
    """``host[:port]`` (``[v6]:port`` too) into its parts; a bad one is a ConfigError."""
    text = endpoint.strip()
    host, port_text, has_port = text, "", False
    if text.startswith("["):
        host, bracket, rest = text[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            raise ConfigError(f"{field}: {endpoint!r} must be host:port, or [IPv6]:port")
        has_port, port_text = bool(rest), rest[1:]
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
        has_port = True
    if not host or any(c.isspace() or c in "/[]" for c in host):
        raise ConfigError(f"{field}: {endpoint!r} must be host:port")
    if ":" in host and not _ipv6(host):  # no host name holds a colon
        raise ConfigError(f"{field}: {endpoint!r} must be host:port, or [IPv6]:port")
    if not has_port:
        return host, default_port
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ConfigError(f"{field}: {endpoint!r} has no valid port (0..65535)")
    return host, int(port_text)


def is_local_address(host: str) -> bool:
    """Whether ``host`` names this machine: loopback, or an address we can bind."""
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    for family, _, _, _, sockaddr in infos:
        with contextlib.suppress(OSError), socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((sockaddr[0], 0))
            return True
    return False


def serves_here(host: str, local_addr: str | None) -> bool:
    """Whether this agent serves a store at ``host``: ``host`` is ``local_addr`` itself,
    or else names this machine. Two different loopback addresses are two hosts (a job of
    several agents simulated on one machine, ``--local-addr 127.0.0.2``): the agent on
    one never serves for the other."""
    if local_addr:
        if local_addr == host:
            return True
        if _loopback_ip(host) and _loopback_ip(local_addr):
            return False
    return is_local_address(host)


def _ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text.partition("%")[0])  # fe80::1%eth0: the zone aside
    except ValueError:
        return False
    return True


def _loopback_ip(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def route_source(host: str, port: int) -> str | None:
    """The address this machine sends from to reach ``host:port`` (None: no route). A UDP
    socket is connected, which picks a route and sends nothing."""
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            return str(sock.getsockname()[0])
    except (OSError, IndexError):
        return None


def is_loopback(host: str) -> bool:
    """Whether ``host`` only ever means this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def endpoint_text(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def get_socket_with_port() -> socket.socket:
    """A listening loopback socket on a free port (the caller closes it)."""
    for family, kind, proto, _, _ in socket.getaddrinfo("localhost", None, type=socket.SOCK_STREAM):
        sock = socket.socket(family, kind, proto)
        try:
            sock.bind(("localhost", 0))
            sock.listen(0)
            return sock
        except OSError:
            sock.close()
    raise RuntimeError("Failed to create a socket")


def get_free_port() -> int:
    """A loopback port that was free a moment ago."""
    with get_socket_with_port() as sock:
        return int(sock.getsockname()[1])
