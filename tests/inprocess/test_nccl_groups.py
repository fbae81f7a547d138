"""Which path a process group's teardown takes is read from its backend's name: an NCCL
group whose backend cannot be had is named in a WARNING and still aborted, never
destroyed without an abort (which can hang on a peer that is gone)."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from agentd.inprocess import teardown
from agentd.support.compat.torch import WORLD_TABLES


class Group:
    def __init__(self, backend: str, reachable: bool) -> None:
        self.backend, self.reachable = backend, reachable

    def _get_backend(self, device):
        if not self.reachable:
            raise RuntimeError("no backend for cuda")
        return SimpleNamespace(kind=self.backend)


def fake_dist(group: Group, calls: list[str]) -> SimpleNamespace:
    c10d = SimpleNamespace(
        _world=SimpleNamespace(pg_map={}),
        _abort_process_group=lambda: calls.append("abort"),
    )
    return SimpleNamespace(
        is_available=lambda: True,
        is_initialized=lambda: True,
        is_nccl_available=lambda: True,
        get_backend=lambda g: g.backend,
        group=SimpleNamespace(WORLD=group),
        distributed_c10d=c10d,
        destroy_process_group=lambda: calls.append("destroy"),
        ProcessGroupNCCL=type("ProcessGroupNCCL", (), {}),
    )


@pytest.fixture
def dist(monkeypatch):
    def install(group: Group) -> list[str]:
        calls: list[str] = []
        monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(device=lambda name: name))
        monkeypatch.setitem(sys.modules, "torch.distributed", fake_dist(group, calls))
        return calls

    return install


def test_an_nccl_group_whose_backend_cannot_be_had_is_named_and_aborted(dist, caplog):
    calls = dist(Group("nccl", reachable=False))
    with caplog.at_level(logging.WARNING):
        teardown.abort_nccl()
        teardown.destroy_process_groups()
    assert calls == ["abort"]  # aborted, never destroyed alone
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "NCCL backend of process group" in warning.getMessage()
    assert "RuntimeError: no backend for cuda" in warning.getMessage()


def test_a_gloo_group_is_destroyed_quietly(dist, caplog, monkeypatch):
    calls = dist(Group("gloo", reachable=False))
    monkeypatch.setattr(
        teardown.threading, "Thread", lambda **kw: SimpleNamespace(start=lambda: None)
    )
    with caplog.at_level(logging.WARNING):
        teardown.abort_nccl()
        teardown.destroy_process_groups()
    assert calls == ["destroy"] and not caplog.records


class Aborting:
    """A thread the teardown starts, run only when the test says."""

    started: list[Aborting] = []

    def __init__(self, target, args, name, daemon) -> None:
        self.target, self.args, self.name, self.joined = target, args, name, False

    def start(self) -> None:
        Aborting.started.append(self)

    def join(self) -> None:
        self.joined = True


@pytest.fixture
def nccl_world(monkeypatch):
    """A process whose one group runs on NCCL, in torch's tables as torch keeps them."""
    calls: list[str] = []
    group = Group("nccl", reachable=False)
    group.abort = lambda: calls.append("group aborted")  # type: ignore[attr-defined]
    world = SimpleNamespace(group_count=1)
    tables = WORLD_TABLES  # checked against torch's own by tests/support/test_compat.py
    for table in tables:
        setattr(world, table, {group: "0"})
    dist = fake_dist(group, calls)
    dist.distributed_c10d._world = world
    dist.distributed_c10d._update_default_pg = lambda pg: calls.append(f"default group {pg}")
    dist.distributed_c10d._unregister_all_process_groups = lambda: calls.append("unregistered")
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace(device=lambda name: name))
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setattr(teardown.threading, "Thread", Aborting)
    monkeypatch.setattr(teardown, "_aborting", None)
    monkeypatch.setattr(Aborting, "started", [])
    monkeypatch.delenv("AGENTD_INPROCESS_NCCL_ABORT", raising=False)
    return SimpleNamespace(calls=calls, world=world, tables=tables)


def test_nccl_groups_are_forgotten_at_once_and_aborted_on_a_thread(nccl_world):
    teardown.destroy_process_groups()
    assert nccl_world.calls == ["default group None", "unregistered"]  # nothing aborted yet
    assert all(getattr(nccl_world.world, t) == {} for t in nccl_world.tables)
    assert nccl_world.world.group_count == 0  # the next group is named "0" again
    [thread] = Aborting.started
    assert thread.name == "agentd-nccl-abort"
    thread.target(*thread.args)
    assert nccl_world.calls[-1] == "group aborted"


def test_a_park_waits_for_the_last_attempts_abort_before_it_starts_another(nccl_world):
    teardown.destroy_process_groups()
    [first] = Aborting.started
    nccl_world.world.pg_names.update({"next": "0"})
    teardown.destroy_process_groups()
    assert first.joined and len(Aborting.started) == 2


def test_wait_makes_the_park_abort_them_itself(nccl_world, monkeypatch):
    monkeypatch.setenv("AGENTD_INPROCESS_NCCL_ABORT", "wait")
    teardown.destroy_process_groups()
    assert nccl_world.calls == ["abort"] and not Aborting.started  # _abort_process_group


def test_an_unknown_mode_is_named_and_the_default_kept(nccl_world, monkeypatch, caplog):
    monkeypatch.setenv("AGENTD_INPROCESS_NCCL_ABORT", "later")
    with caplog.at_level(logging.WARNING):
        teardown.destroy_process_groups()
    assert len(Aborting.started) == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "AGENTD_INPROCESS_NCCL_ABORT='later' is not one of background, wait" in warning


def test_a_group_whose_abort_fails_is_named_and_the_others_still_aborted(nccl_world, caplog):
    def refuse() -> None:
        raise RuntimeError("NCCL error: unhandled system error")

    broken = Group("nccl", reachable=False)
    broken.abort = refuse  # type: ignore[attr-defined]
    nccl_world.world.pg_names[broken] = "1"  # the newer group: aborted first
    teardown.destroy_process_groups()
    [thread] = Aborting.started
    with caplog.at_level(logging.WARNING):
        thread.target(*thread.args)
    assert nccl_world.calls[-1] == "group aborted"
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "could not all be aborted (RuntimeError: NCCL error: unhandled system error)" in warning
