"""Where a command line reaches the local agent's HTTP endpoint (``agentd status``,
``agentd drain``), and whether a URL given for it can be one."""

from __future__ import annotations

DEFAULT_PORT = 29401


def default_url(environ: dict[str, str]) -> str:
    """``AGENTD_STATUS_URL``, else the local agent on ``AGENTD_HEALTH_PORT`` (or 29401)."""
    if environ.get("AGENTD_STATUS_URL"):
        return environ["AGENTD_STATUS_URL"]
    port = environ.get("AGENTD_HEALTH_PORT") or environ.get("TORCHELASTIC_HEALTH_CHECK_PORT")
    return f"http://127.0.0.1:{port or DEFAULT_PORT}"


def url_problem(url: str) -> str:
    """Why ``url`` cannot be an agent's health endpoint ('' when it can)."""
    from urllib.parse import urlsplit

    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (raises on a bad port)
    except ValueError as exc:
        return f"is not a valid URL ({exc})"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return "must be an http(s)://host:port URL, e.g. http://127.0.0.1:29401"
    return ""
