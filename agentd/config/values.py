"""Option values: text in, a typed value out, or a :class:`RuleError` with the rule.

Each parser is named by what it accepts; :data:`agentd.config.resolve.OPTIONS` pairs every option
with one, and the caller says where a bad value came from.
"""

from __future__ import annotations

import re
import signal
from collections.abc import Callable, Sequence
from typing import Literal

from agentd.exceptions import ConfigError
from agentd.restart_policy import RestartBackoff
from agentd.spec import (
    MAX_LOCAL_WORLD_SIZE,
    NAME_RULE,
    Std,
    check_log_prefix,
    check_name,
    is_module_name,
)

MAX_NODES = 65536
"""The most nodes a rendezvous may wait for (``--nnodes``)."""


class RuleError(ValueError):
    """A parser's complaint: the rule a value broke (the caller adds where it came from)."""


def integer(low: int | None = None, high: int | None = None) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text.strip())
        except ValueError:
            raise RuleError("is not an integer") from None
        if low is not None and value < low:
            raise RuleError(f"must be >= {low}")
        if high is not None and value > high:
            raise RuleError(f"must be <= {high}")
        return value

    return parse


def number(low: float = 0.0, strict: bool = False) -> Callable[[str], float]:
    def parse(text: str) -> float:
        try:
            value = float(text.strip())
        except ValueError:
            raise RuleError("is not a number (seconds)") from None
        if value != value or value in (float("inf"), float("-inf")):
            raise RuleError("must be a finite number")
        if value < low or (strict and value == low):
            raise RuleError(f"must be {'>' if strict else '>='} {low:g}")
        return value

    return parse


def boolean(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise RuleError("is not a boolean (use 1/0, true/false, yes/no)")


def optional_seconds(text: str) -> float | None:
    """A timeout in seconds (> 0), or empty for none."""
    return number(0.0, strict=True)(text) if text.strip() else None


def section_timeouts(text: str) -> dict[str, float]:
    """``NAME=SECONDS[,NAME=SECONDS...]``: a timeout for each named section."""
    from agentd.wire.progress import check_section_name

    out: dict[str, float] = {}
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        name, sep, seconds = item.rpartition("=")
        if not sep:
            raise RuleError(f"must be NAME=SECONDS items; {item!r} has no '='")
        try:
            check_section_name(name.strip())
        except ValueError as exc:
            raise RuleError(str(exc)) from None
        try:
            out[name.strip()] = number(0.0, strict=True)(seconds)
        except RuleError as exc:
            raise RuleError(f"{name.strip()}: {seconds.strip()!r} {exc}") from None
    return out


def text(text: str) -> str:
    return text


_HOST_LABEL = re.compile(r"(?!-)[A-Za-z0-9_-]{1,63}(?<!-)")


def host(text: str) -> str:
    """An IP address (v4, or v6 with or without brackets) or a DNS host name: the syntax
    only, so a typo is a usage error (exit 2) and not a failure to listen or connect."""
    import ipaddress

    name = text.strip()
    bare = name[1:-1] if name.startswith("[") and name.endswith("]") else name
    try:
        ipaddress.ip_address(bare)
        return bare
    except ValueError:
        pass
    labels = name.removesuffix(".").split(".")
    if not name or len(name) > 253 or not all(_HOST_LABEL.fullmatch(x) for x in labels):
        raise RuleError(
            "must be an IP address or a host name (letters, digits, '-' and '_' in "
            "dot-separated labels)"
        )
    return name


def optional_host(text: str) -> str | None:
    return host(text) if text.strip() else None


def node_checks(text: str) -> tuple[str, ...]:
    """One check per line: a shell command or a built-in (:mod:`agentd.nodecheck.checks`)."""
    if not text.strip():
        return ()  # a job without node checks never loads them
    from agentd.nodecheck.checks import parse_node_checks

    try:
        return parse_node_checks(text)
    except ValueError as exc:
        raise RuleError(str(exc)) from None


def optional_text(text: str) -> str | None:
    return text or None


def logs_specs(text: str) -> str:
    """torchrun's ``--logs-specs``: an entry point's name (``""``: the default layout);
    :func:`agentd.config.build.logs_specs_from` loads it."""
    name = text.strip()
    if name == "default":
        return ""
    if name and not re.fullmatch(r"[\w.-]+", name):
        raise RuleError("must name a torchrun.logs_specs entry point (letters, digits, _ . -)")
    return name


def filters(text: str) -> tuple[str, ...]:
    """torchrun's filter list: comma-separated, a doubled comma stands for a comma."""
    parts = text.replace(",,", "\0").split(",")
    return tuple(p.replace("\0", ",") for p in parts if p)


def preload(text: str) -> tuple[str, ...] | Literal["auto"] | None:
    """``--preload``: ``auto`` (chosen from the script's imports, :mod:`agentd.preload.auto`),
    ``off`` (spawn), or the modules a zygote imports (may be none)."""
    choice = text.strip().lower()
    if choice in ("off", "false"):
        return None
    if choice == "auto":
        return "auto"
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    for name in names:
        if not is_module_name(name):
            raise RuleError(
                f"names {name!r}, which is not a module name (dotted Python "
                "identifiers, comma-separated; 'auto' or 'off')"
            )
    return names


def standby_count(text: str) -> int | None:
    """``--standby-workers``: ``auto`` (None: one per local rank where the group may
    restart) or a count."""
    if text.strip().lower() == "auto":
        return None
    try:
        count = int(text.strip())
    except ValueError:
        raise RuleError("must be 'auto' or a whole number of workers") from None
    if not 0 <= count <= 1024:
        raise RuleError("must be 'auto' or within 0..1024")
    return count


def unsupported(why: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        if text.strip():
            raise RuleError(why)
        return ""

    return parse


def choice(choices: Sequence[str], upper: bool = False) -> Callable[[str], str]:
    def parse(text: str) -> str:
        value = text.strip().upper() if upper else text.strip()
        if value not in choices:
            raise RuleError(f"must be one of {', '.join(choices)}")
        return value

    return parse


def parse_signal(text: str) -> signal.Signals:
    """``SIGTERM``, ``TERM`` or ``15``."""
    name = text.strip().upper()
    try:
        if name.isdigit():
            return signal.Signals(int(name))
        return signal.Signals[name if name.startswith("SIG") else "SIG" + name]
    except (KeyError, ValueError):
        raise RuleError("is not a signal name or number (e.g. SIGTERM)") from None


def optional_port(text: str) -> int | None:
    return integer(0, 65535)(text) if text.strip() else None


def optional_signal(text: str) -> signal.Signals | None:
    """A signal sent to the workers for them to act on (a checkpoint, a stack dump), or
    none: SIGKILL and SIGSTOP, which no worker can catch, would kill or freeze it instead."""
    if not text.strip():
        return None
    sig = parse_signal(text)
    if sig in (signal.SIGKILL, signal.SIGSTOP):
        raise RuleError(f"cannot be {sig.name}: a worker cannot catch it (e.g. SIGUSR1)")
    return sig


def signals(text: str) -> tuple[signal.Signals, ...]:
    items = [item for item in text.split(",") if item.strip()]
    if not items:
        raise RuleError("must list at least one signal")
    sigs = tuple(parse_signal(item) for item in items)
    if signal.SIGKILL in sigs or signal.SIGSTOP in sigs:
        raise RuleError("cannot include SIGKILL or SIGSTOP (they cannot be handled)")
    return sigs


def optional_signals(text: str) -> tuple[signal.Signals, ...]:
    return signals(text) if text.strip() else ()


def exit_codes(text: str) -> frozenset[int]:
    codes: set[int] = set()
    if not text.strip():
        return frozenset()
    for item in text.split(","):
        item = item.strip()
        if not item:
            raise RuleError("has an empty item; write a comma-separated list such as 2,3")
        try:
            code = int(item)
        except ValueError:
            raise RuleError("must be a comma-separated list of exit codes") from None
        if not 1 <= code <= 255:
            raise RuleError("exit codes must be within 1..255")
        codes.add(code)
    return frozenset(codes)


def ranks(text: str) -> frozenset[int] | None:
    if not text.strip():
        return None
    try:
        ranks = frozenset(int(item) for item in text.split(","))
    except ValueError:
        raise RuleError("must be a comma-separated list of local ranks, e.g. 0,2") from None
    if any(rank < 0 for rank in ranks):
        raise RuleError("local ranks must be >= 0")
    return ranks


def std_setting(name: str) -> Callable[[str], Std | dict[int, Std]]:
    def parse(text: str) -> Std | dict[int, Std]:
        try:
            return Std.parse(text, name)
        except ConfigError:
            raise RuleError(
                "must be 0-3 (0 none, 1 stdout, 2 stderr, 3 both) or LOCAL_RANK:0-3,..."
            ) from None

    return parse


def backoff(text: str) -> RestartBackoff:
    try:
        return RestartBackoff.parse(text)
    except ConfigError as exc:
        raise RuleError(str(exc).split(" ", 2)[-1]) from None


def parse_nnodes(text: str) -> tuple[int, int]:
    """``N`` or ``MIN:MAX``."""
    match = re.fullmatch(r"\s*(\d+)\s*(?::\s*(\d+)\s*)?", text)
    if not match:
        raise RuleError("must be N or MIN:MAX")
    low = int(match.group(1))
    high = int(match.group(2) or low)
    if low < 1 or high < low:
        raise RuleError("must have 1 <= MIN <= MAX")
    if high > MAX_NODES:
        raise RuleError(f"must be at most {MAX_NODES} nodes")
    return low, high


def nproc(text: str) -> str:
    value = text.strip()
    if value in ("auto", "cpu", "gpu"):
        return value
    if value.isdigit() and 1 <= int(value) <= MAX_LOCAL_WORLD_SIZE:
        return str(int(value))
    raise RuleError(f"must be an integer within 1..{MAX_LOCAL_WORLD_SIZE}, auto, cpu or gpu")


def run_name(text: str) -> str:
    try:
        return check_name("name", text)
    except ConfigError:
        raise RuleError(NAME_RULE) from None


def optional_run_name(text: str) -> str:
    return run_name(text) if text else ""


def log_prefix(text: str) -> str:
    try:
        return check_log_prefix(text)
    except ConfigError as exc:
        raise RuleError(str(exc).split(" ", 2)[-1]) from None
