"""One option of ``agentd run``: its field name (also the TOML key), flags, parser, default,
help and environment variables; the tables are in :mod:`agentd.config.options`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

ENV_PREFIXES = ("AGENTD_", "PET_")
RDZV_BACKENDS = ("static", "agentd", "c10d", "etcd", "etcd-v2")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Option(NamedTuple):
    """One setting: its field name (also the TOML key), its flags, parser and default."""

    name: str
    flags: tuple[str, ...]
    parse: Callable[[str], Any]
    default: str
    help: str
    is_flag: bool = False
    metavar: str | None = None
    torch_env: str | tuple[str, ...] | None = None
    """torch variables that also set this option, after ``AGENTD_*`` and ``PET_*``."""
    repeatable: bool = False
    """The flag may be given more than once; the values are joined with ``separator``."""
    separator: str = ","

    @property
    def env_names(self) -> tuple[str, ...]:
        names = tuple(prefix + self.name.upper() for prefix in ENV_PREFIXES)
        extra = (self.torch_env,) if isinstance(self.torch_env, str) else self.torch_env or ()
        return (*names, *extra)


def option(
    name: str,
    parse: Callable[[str], Any],
    default: str,
    help: str,
    *extra: str,
    is_flag: bool = False,
    metavar: str | None = None,
    torch_env: str | tuple[str, ...] | None = None,
    repeatable: bool = False,
    separator: str = ",",
) -> Option:
    dashed = "--" + name.replace("_", "-")
    flags = [dashed] + (["--" + name] if "_" in name else []) + list(extra)
    return Option(
        name, tuple(flags), parse, default, help, is_flag, metavar, torch_env, repeatable, separator
    )
