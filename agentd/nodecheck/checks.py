"""The checks a host passes to be a member: any shell command, and three built-ins.

``--node-check`` takes one check per flag (or per line of ``AGENTD_NODE_CHECK``):

- ``builtin:disk[=SIZE]``: at least SIZE free (default 1GiB; ``500MB``, ``20GiB``, bytes)
  on the file system of the log directory;
- ``builtin:gpus[=N]``: ``nvidia-smi -L`` lists at least N GPUs (default: the number of
  workers per node); passes, saying it was skipped, where ``nvidia-smi`` is not installed;
- ``builtin:store``: a TCP connection to the rendezvous endpoint opens within 5 s;
- anything else: a shell command that passes by exiting 0 within 60 s (its last output
  line says why it failed).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from agentd.support.owned import owned
from agentd.support.secrets import child_env
from agentd.view import Helpers

COMMAND_TIMEOUT = 60.0
CONNECT_TIMEOUT = 5.0
DEFAULT_MIN_FREE = 2**30
_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGT]i?B|B)?$", re.IGNORECASE)
_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
BUILTIN = "builtin:"


@dataclass(frozen=True)
class CheckResult:
    name: str
    ok: bool
    detail: str


class NodeCheck(Protocol):
    name: str
    helpers: Helpers | None

    async def run(self) -> CheckResult: ...


def parse_node_checks(text: str) -> tuple[str, ...]:
    """The option's value: one check per line, each built-in checked for its syntax."""
    specs = tuple(line.strip() for line in text.splitlines() if line.strip())
    for spec in specs:
        if spec.startswith(BUILTIN):
            _builtin(spec)
    return specs


def _builtin(spec: str) -> tuple[str, str]:
    name, _, arg = spec[len(BUILTIN) :].partition("=")
    if name == "disk":
        if arg:
            parse_size(arg)
    elif name == "gpus":
        if arg and not (arg.isdigit() and int(arg) > 0):
            raise ValueError(f"has {spec!r}: the GPU count must be a positive integer")
    elif name == "store":
        if arg:
            raise ValueError(f"has {spec!r}: builtin:store takes no value")
    else:
        raise ValueError(
            f"names an unknown built-in {spec!r} (the built-ins are "
            "builtin:disk[=SIZE], builtin:gpus[=N] and builtin:store)"
        )
    return name, arg


def parse_size(text: str) -> int:
    match = _SIZE.match(text.strip())
    if match is None:
        raise ValueError(f"has {text!r}, which is not a size (e.g. 1GiB, 500MB, 1048576)")
    return int(float(match[1]) * _UNITS[(match[2] or "").upper()])


def build_checks(
    specs: Sequence[str], log_dir: Path, nproc: int, store: tuple[str, int] | None
) -> list[NodeCheck]:
    """The checks ``specs`` name, for a host that logs to ``log_dir``, runs ``nproc``
    workers and rendezvous at ``store`` (None: no store to reach)."""
    checks: list[NodeCheck] = []
    for spec in specs:
        if not spec.startswith(BUILTIN):
            checks.append(CommandCheck(spec))
            continue
        name, arg = _builtin(spec)
        if name == "disk":
            checks.append(FreeDisk(log_dir, parse_size(arg) if arg else DEFAULT_MIN_FREE))
        elif name == "gpus":
            checks.append(GpuCount(int(arg) if arg else nproc))
        else:
            checks.append(StoreReachable(store))
    return checks


class CommandCheck:
    """A shell command; passes on exit 0. Killed (its whole group) after 60 s."""

    def __init__(self, command: str, timeout: float = COMMAND_TIMEOUT) -> None:
        self.name = command
        self.helpers: Helpers | None = None
        self._timeout = timeout

    async def run(self, keep_output: bool = False) -> CheckResult:
        """The result; its detail is the last output line (all of it with ``keep_output``)."""
        from agentd.support.aio import use_pidfd_child_watcher

        use_pidfd_child_watcher()
        start = asyncio.create_subprocess_shell(
            self.name,
            env=child_env(),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            async with owned(self.helpers, start) as proc:
                try:
                    async with asyncio.timeout(self._timeout):
                        output, _ = await proc.communicate()
                except TimeoutError:
                    return CheckResult(self.name, False, f"no answer within {self._timeout:g}s")
                finally:
                    if proc.returncode is None:  # timed out or cancelled: nothing of it stays
                        with contextlib.suppress(ProcessLookupError):
                            os.killpg(proc.pid, signal.SIGKILL)
                        await asyncio.shield(proc.wait())
        except OSError as exc:
            return CheckResult(self.name, False, f"could not run: {exc.strerror}")
        text = output.decode(errors="replace").strip()
        lines = text.splitlines()
        last = lines[-1][:200] if lines else ""
        if proc.returncode == 0:
            return CheckResult(self.name, True, (text if keep_output else last) or "exit code 0")
        return CheckResult(
            self.name, False, f"exit code {proc.returncode}" + (f": {last}" if last else "")
        )


class FreeDisk:
    """At least ``min_free`` bytes free where the logs go."""

    def __init__(self, path: Path, min_free: int) -> None:
        self.name = "builtin:disk"
        self.helpers: Helpers | None = None
        self._path = path
        self._min_free = min_free

    async def run(self) -> CheckResult:
        path = self._path
        while not path.exists() and path.parent != path:
            path = path.parent
        try:
            free = shutil.disk_usage(path).free
        except OSError as exc:
            return CheckResult(self.name, False, f"{path}: {exc.strerror}")
        text = (
            f"{free / 2**30:.1f} GiB free under {path} "
            f"(at least {self._min_free / 2**30:.1f} GiB needed)"
        )
        return CheckResult(self.name, free >= self._min_free, text)


class GpuCount:
    """``nvidia-smi -L`` lists at least ``expected`` GPUs (skipped without nvidia-smi)."""

    def __init__(self, expected: int) -> None:
        self.name = "builtin:gpus"
        self.helpers: Helpers | None = None
        self._expected = expected

    async def run(self) -> CheckResult:
        if shutil.which("nvidia-smi") is None:
            return CheckResult(self.name, True, "skipped: nvidia-smi is not installed")
        smi = CommandCheck("nvidia-smi -L", timeout=30.0)
        smi.helpers = self.helpers
        result = await smi.run(keep_output=True)
        if not result.ok:
            return CheckResult(self.name, False, f"nvidia-smi -L: {result.detail}")
        found = sum(line.startswith("GPU ") for line in result.detail.splitlines())
        return CheckResult(
            self.name, found >= self._expected, f"{found} GPU(s) seen, {self._expected} expected"
        )


class StoreReachable:
    """A TCP connection to the rendezvous endpoint opens (passes when there is none)."""

    def __init__(self, endpoint: tuple[str, int] | None) -> None:
        self.name = "builtin:store"
        self.helpers: Helpers | None = None
        self._endpoint = endpoint

    async def run(self) -> CheckResult:
        if self._endpoint is None:
            return CheckResult(self.name, True, "skipped: no agents' store (--standalone, static)")
        host, port = self._endpoint
        try:
            async with asyncio.timeout(CONNECT_TIMEOUT):
                _, writer = await asyncio.open_connection(host, port)
        except (OSError, TimeoutError) as exc:
            why = getattr(exc, "strerror", None) or str(exc) or "no answer"
            return CheckResult(self.name, False, f"{host}:{port} unreachable: {why}")
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return CheckResult(self.name, True, f"{host}:{port} reachable")
