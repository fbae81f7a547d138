"""Where a command line reaches the local agent's HTTP endpoint (``agentd status``,
``agentd drain``, ``agentd logs``), and whether a URL given for it can be one."""

from __future__ import annotations

from typing import TYPE_CHECKING

from agentd.exceptions import ConfigError

if TYPE_CHECKING:
    import argparse
    import ssl

DEFAULT_PORT = 29401
CACERT_ENV = "AGENTD_HEALTH_CACERT"


def default_url(environ: dict[str, str]) -> str:
    """``AGENTD_STATUS_URL``, else the local agent on ``AGENTD_HEALTH_PORT`` (or 29401)."""
    if environ.get("AGENTD_STATUS_URL"):
        return environ["AGENTD_STATUS_URL"]
    port = environ.get("AGENTD_HEALTH_PORT") or environ.get("TORCHELASTIC_HEALTH_CHECK_PORT")
    return f"http://127.0.0.1:{port or DEFAULT_PORT}"


def given_url(text: str) -> str:
    """An endpoint as a user types it: ``29401`` or ``:29401`` (this host's agent on that
    port, as ``--health-port`` set it), ``host:29401`` (over http), or a URL, unchanged."""
    if "://" in text:
        return text
    host, _, port = text.rpartition(":")
    if not port.isdigit():
        return text
    return f"http://{host or '127.0.0.1'}:{port}"


def named_endpoint(args: argparse.Namespace) -> str | None:
    """The one agent that URL, ``--url`` and ``--health-port`` name (None: the default);
    a :class:`ConfigError` naming the argument where one names no endpoint, or where they
    name two agents."""
    port = args.health_port
    if port is not None and not (port.isdigit() and 0 < int(port) <= 65535):
        raise ConfigError(f"--health-port: {port!r} must be a port, 1..65535")
    given = [
        (name, value)
        for name, value in (("URL", args.url_arg), ("--url", args.url), ("--health-port", port))
        if value is not None
    ]
    urls = [given_url(value) for _, value in given]
    for (name, value), url in zip(given, urls, strict=True):
        if problem := endpoint_problem(value, url):
            raise ConfigError(f"{name}: {value!r} {problem}")
    for (one, first), (other, second), url in zip(given, given[1:], urls[1:], strict=False):
        if url != urls[0]:
            raise ConfigError(f"{one}: {first!r} and {other} {second!r} name two agents")
    return urls[0] if urls else None


def read_endpoints(args: argparse.Namespace) -> None:
    """Set ``args.url`` to the agent the arguments name (:func:`named_endpoint`), and
    ``args.job`` (``agentd status --job URL``) to its URL; a :class:`ConfigError` names the
    argument that gave a bad one, as it does a ``--timeout`` outside (0, 3600] seconds."""
    if not 0 < args.timeout <= 3600:
        raise ConfigError(
            f"--timeout: {args.timeout:g} must be more than 0 and at most 3600 seconds"
        )
    args.url = named_endpoint(args)
    if getattr(args, "job", None):
        raw, args.job = args.job, given_url(args.job)
        if problem := endpoint_problem(raw, args.job):
            raise ConfigError(f"--job: {raw!r} {problem}")


def base_url(url: str | None, environ: dict[str, str]) -> str:
    """The endpoint to ask, without a trailing '/': ``url`` (checked already by
    :func:`named_endpoint`), else the default (:func:`default_url`); a
    :class:`ConfigError` naming the variable that made the default no endpoint."""
    base = (url or default_url(environ)).rstrip("/")
    if url is None:
        for name in ("AGENTD_STATUS_URL", "AGENTD_HEALTH_PORT", "TORCHELASTIC_HEALTH_CHECK_PORT"):
            if value := environ.get(name):
                if problem := endpoint_problem(value, base):
                    raise ConfigError(f"{name}: {value!r} {problem}")
                break
    return base


def endpoint_problem(value: str, url: str) -> str:
    """Why ``value`` (as typed: a port, host:port or a URL; ``url`` as it reads) names no
    agent's endpoint ('' when it does)."""
    port = value.removeprefix(":")
    if port.isdigit() and not 0 < int(port) <= 65535:
        return "must be a port, 1..65535"
    return url_problem(url)


def url_problem(url: str) -> str:
    """Why ``url`` cannot be an agent's health endpoint ('' when it can)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return (
            "must be an http(s)://host:port URL (e.g. http://127.0.0.1:29401), host:port or "
            "the local agent's port"
        )
    return ""


def tls_context(url: str, cacert: str | None) -> ssl.SSLContext | None:
    """How an ``https`` endpoint is verified: against ``cacert`` (``--cacert``, else
    ``AGENTD_HEALTH_CACERT``), else the system's CAs; None for plain ``http``."""
    if not url.startswith("https:"):
        return None
    import os
    import ssl

    return ssl.create_default_context(cafile=cacert or os.environ.get(CACERT_ENV) or None)


def fetch(
    url: str, timeout: float, cacert: str | None = None, headers: dict[str, str] | None = None
) -> tuple[int, bytes]:
    """GET ``url`` (with ``headers``): the status code and body (HTTP errors included,
    not raised); an ``https`` one verified against ``cacert`` (see :func:`tls_context`)."""
    import urllib.error
    import urllib.request

    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(
            request, timeout=timeout, context=tls_context(url, cacert)
        ) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()
