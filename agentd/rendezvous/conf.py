"""``--rdzv-conf key=value,...``: parsed once, each backend takes its keys, the rest is an error."""

from __future__ import annotations

from typing import NamedTuple

from agentd.exceptions import ConfigError


class RendezvousSettings(NamedTuple):
    """How a dynamic rendezvous waits (seconds); ``--rdzv-conf`` sets the timeouts."""

    min_nodes: int = 1
    max_nodes: int = 1
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    keep_alive_interval: float = 5.0
    keep_alive_max_attempt: int = 3

    @property
    def heartbeat_ttl(self) -> float:
        """A heartbeat not refreshed for this long means its agent is gone."""
        return self.keep_alive_interval * self.keep_alive_max_attempt


_SECONDS = ("join_timeout", "last_call_timeout", "close_timeout", "keep_alive_interval")


def parse_rdzv_conf(text: str) -> dict[str, str]:
    """``key=value,key=value`` into a dict; a malformed item is a ConfigError."""
    conf: dict[str, str] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"--rdzv-conf: {item.strip()!r} must be key=value")
        conf[key] = value.strip()
    return conf


def pop_seconds(conf: dict[str, str], key: str) -> float | None:
    """Take ``key`` out of ``conf`` as seconds > 0 (None when absent)."""
    if key not in conf:
        return None
    raw = conf.pop(key)
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ConfigError(f"--rdzv-conf: {key}={raw!r} must be a number of seconds > 0")
    return value


def pop_bool(conf: dict[str, str], key: str) -> bool | None:
    """Take ``key`` out of ``conf`` as a boolean (None when absent)."""
    if key not in conf:
        return None
    raw = conf.pop(key)
    lowered = raw.lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"--rdzv-conf: {key}={raw!r} must be true or false")


def settings_from_conf(
    conf: dict[str, str], nnodes: tuple[int, int], timeout_is_join: bool = False
) -> RendezvousSettings:
    """Take the rendezvous keys out of ``conf`` (the rest belong to the backend's store).

    ``timeout`` means what torch's backend of the same name makes of it: the join timeout
    for etcd (``timeout_is_join``); nothing for c10d, whose join timeout is
    ``join_timeout``, so it is taken and ignored."""
    if "timeout" in conf:
        timeout = conf.pop("timeout")
        if timeout_is_join:
            conf.setdefault("join_timeout", timeout)
    values: dict[str, float | int] = {"min_nodes": nnodes[0], "max_nodes": nnodes[1]}
    for key in _SECONDS:
        seconds = pop_seconds(conf, key)
        if seconds is not None:
            values[key] = seconds
    if "keep_alive_max_attempt" in conf:
        raw = conf.pop("keep_alive_max_attempt")
        if not raw.isdigit() or int(raw) < 1:
            raise ConfigError(
                f"--rdzv-conf: keep_alive_max_attempt={raw!r} must be an integer >= 1"
            )
        values["keep_alive_max_attempt"] = int(raw)
    return RendezvousSettings(**values)  # type: ignore[arg-type]


class UnknownSetting(ConfigError):
    """A ``--rdzv-conf`` key that the backend does not use (``key`` names it)."""

    def __init__(self, key: str, backend: str) -> None:
        super().__init__(f"--rdzv-conf: {key!r} is not a setting of the {backend} backend")
        self.key = key


def reject_unknown(conf: dict[str, str], backend: str) -> None:
    """Every key left is one no part of ``backend`` took: an error."""
    if conf:
        raise UnknownSetting(sorted(conf)[0], backend)
