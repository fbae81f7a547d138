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
