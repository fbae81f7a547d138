"""The health endpoint's settings, light enough for the command line to build without
loading the server (aiohttp is imported only when the endpoint is on)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class HealthSettings:
    """Where the endpoint listens and how stale the watchdog may get (``--health-*``)."""

    port: int
    host: str = "127.0.0.1"
    timeout: float = 5.0
    token: str | None = None
    """What ``POST /drain`` must carry (``--drain-token``; None: the agent makes one and
    publishes it for its user only). Never the store's token."""
    cert: str | None = None
    """Serve over TLS with this certificate and :attr:`key` (PEM files; None: plain HTTP)."""
    key: str | None = None
    required: bool = True
    """False for torch's ``TORCHELASTIC_HEALTH_CHECK_PORT``: a port that cannot be bound
    (another agent on this host has it) is a warning and the job runs without the
    endpoint; ``--health-port`` makes it an error."""
