"""The gate on fakes and on real commands: exclusion, cooldown, giving up, the checks."""

from __future__ import annotations

import asyncio
import shutil
import time

import psutil
import pytest

from agentd.config.values import RuleError, node_checks
from agentd.nodecheck.checks import (
    CheckResult,
    CommandCheck,
    FreeDisk,
    GpuCount,
    StoreReachable,
    build_checks,
    parse_node_checks,
    parse_size,
)
from agentd.nodecheck.gate import NodeCheckSettings, NodeGate, NodeUnfit


class Scripted:
    """A check that fails ``failures`` times, then passes."""

    name = "scripted"

    def __init__(self, failures: int) -> None:
        self.failures = failures

    async def run(self) -> CheckResult:
        self.failures -= 1
        return CheckResult(self.name, self.failures < 0, "ok" if self.failures < 0 else "bad")


class PassesThenFails:
    name = "scripted"

    def __init__(self, passes: int) -> None:
        self.passes = passes

    async def run(self) -> CheckResult:
        self.passes -= 1
        ok = self.passes >= 0
        return CheckResult(self.name, ok, "ok" if ok else "bad")


async def test_admit_excludes_with_a_doubling_cooldown_then_lets_in():
    events = []
    published = []
    gate = NodeGate([Scripted(2)], NodeCheckSettings(cooldown=0.05, max_exclusions=5))
    gate.notify = lambda hook, *args: events.append(hook)

    async def publish(doc):
        published.append(doc)

    began = time.monotonic()
    await gate.admit(publish)
    assert time.monotonic() - began >= 0.05 + 0.1  # 1x then 2x the cooldown
    assert events == ["node_excluded", "node_excluded", "node_readmitted"]
    assert [d and d["exclusions"] for d in published] == [1, 2, None]
    assert published[1]["reason"] == "scripted: bad" and published[1]["cooldown"] == 0.1
    assert gate.excluded is None and gate.failures == {"scripted": 2}


async def test_one_exclusion_too_many_gives_up_with_exit_code_4():
    gate = NodeGate([Scripted(99)], NodeCheckSettings(cooldown=0.01, max_exclusions=2))
    with pytest.raises(NodeUnfit, match=r"failed 3 times within 60 min .*scripted: bad") as exc:
        await gate.admit()
    assert exc.value.exit_code == 4


async def test_a_publish_that_fails_is_logged_not_fatal(caplog):
    gate = NodeGate([Scripted(1)], NodeCheckSettings(cooldown=0.01))

    async def broken(doc):
        raise OSError("store down")

    await gate.admit(broken)
    assert "Could not publish this node's exclusion in the store: store down" in caplog.text


async def test_watch_returns_the_failures_once_a_check_fails():
    gate = NodeGate([PassesThenFails(3)], NodeCheckSettings(interval=0.01))
    [failed] = await asyncio.wait_for(gate.watch(), 5)
    assert failed.detail == "bad" and gate.failures == {"scripted": 1}


async def test_a_failing_watch_publishes_why_before_the_host_leaves():
    """The others re-form as soon as this host leaves, and name why it is out from what it
    published: publishing only at the next admit's check lost that race under load (the
    others' round sealed first, and said nothing). The watch's publish is not counted
    (the admit's check counts the exclusion)."""
    from agentd.nodecheck.service import NodeCheckService

    order: list[tuple[object, ...]] = []

    class Handler:
        exclusions = None

        async def publish_exclusion(self, doc):
            order.append(("published", doc["reason"], doc["exclusions"], doc["cooldown"]))

    gate = NodeGate([PassesThenFails(1)], NodeCheckSettings(interval=0.01, cooldown=0.5))
    left = asyncio.Event()

    def leave(why: str) -> None:
        order.append(("left", why))
        left.set()

    service = NodeCheckService(gate, Handler(), leave, lambda *args: None, None)
    service.workers_started()
    await asyncio.wait_for(left.wait(), 5)
    assert order == [
        ("published", "scripted: bad", 1, 0.5),
        ("left", "failed its node checks (scripted: bad)"),
    ]
    assert gate.excluded is None


async def test_a_command_passes_on_exit_0_and_says_why_it_failed(tmp_path):
    assert (await CommandCheck("echo fine").run()).ok
    result = await CommandCheck("echo checking; echo 'ECC errors: 3' >&2; exit 2").run()
    assert (result.ok, result.detail) == (False, "exit code 2: ECC errors: 3")


async def test_a_command_that_hangs_is_killed_with_its_children(tmp_path):
    pidfile = tmp_path / "pid"
    check = CommandCheck(f"sleep 60 & echo $! > {pidfile}; wait", timeout=0.5)
    result = await check.run()
    assert (result.ok, result.detail) == (False, "no answer within 0.5s")
    pid = int(pidfile.read_text())

    def gone() -> bool:  # a zombie is dead (an earlier test may have made us a subreaper)
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    deadline = time.monotonic() + 10
    while not gone():
        assert time.monotonic() < deadline, "the check's child outlived it"
        await asyncio.sleep(0.05)


async def test_builtins(tmp_path):
    free = shutil.disk_usage(tmp_path).free
    assert (await FreeDisk(tmp_path / "not" / "yet", 1).run()).ok
    result = await FreeDisk(tmp_path, free * 4).run()
    assert not result.ok and "GiB free under" in result.detail
    if shutil.which("nvidia-smi") is None:
        result = await GpuCount(8).run()
        assert result.ok and "skipped" in result.detail
    server = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        assert (await StoreReachable(("127.0.0.1", port)).run()).ok
    result = await StoreReachable(("127.0.0.1", port)).run()
    assert not result.ok and f"127.0.0.1:{port} unreachable" in result.detail
    assert (await StoreReachable(None).run()).ok


def test_specs_are_checked_and_built(tmp_path):
    assert parse_node_checks("builtin:disk=20GiB\n\n  /opt/check.sh --fast, really \n") == (
        "builtin:disk=20GiB",
        "/opt/check.sh --fast, really",
    )
    assert parse_size("1.5KiB") == 1536 and parse_size("500MB") == 500 * 10**6
    for bad, message in [
        ("builtin:disk=lots", "is not a size"),
        ("builtin:gpus=0", "positive integer"),
        ("builtin:store=x", "takes no value"),
        ("builtin:cpu", "unknown built-in"),
    ]:
        with pytest.raises(RuleError, match=message):
            node_checks(bad)
    checks = build_checks(
        ["builtin:disk", "builtin:gpus", "builtin:store", "true"], tmp_path, 4, ("127.0.0.1", 1)
    )
    assert [c.name for c in checks] == ["builtin:disk", "builtin:gpus", "builtin:store", "true"]


def test_commands_keep_their_commas_from_flags_variables_and_files(tmp_path):
    from agentd.config.resolve import resolve

    checks = ("nvidia-smi --query-gpu=name,memory.total", "builtin:store")
    config = resolve({"script": "t.py", "node_check": list(checks)}, {}, None)
    assert config.node_check == checks
    config = resolve({"script": "t.py"}, {"AGENTD_NODE_CHECK": "\n".join(checks)}, None)
    assert config.node_check == checks
    file = tmp_path / "c.toml"
    file.write_text('node_check = ["nvidia-smi --query-gpu=name,memory.total", "builtin:store"]')
    assert resolve({"script": "t.py"}, {}, str(file)).node_check == checks
