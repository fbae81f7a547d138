"""Which path a process group's teardown takes is read from its backend's name: an NCCL
group whose backend cannot be had is named in a WARNING and still aborted, never
destroyed without an abort (which can hang on a peer that is gone)."""

from __future__ import annotations

import logging
import sys
from types import SimpleNamespace

import pytest

from agentd.inprocess import worker


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
        worker._abort_nccl()
        worker._destroy_process_group()
    assert calls == ["abort"]  # aborted, never destroyed alone
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert "NCCL backend of process group" in warning.getMessage()
    assert "RuntimeError: no backend for cuda" in warning.getMessage()


def test_a_gloo_group_is_destroyed_quietly(dist, caplog, monkeypatch):
    calls = dist(Group("gloo", reachable=False))
    monkeypatch.setattr(
        worker.threading, "Thread", lambda **kw: SimpleNamespace(start=lambda: None)
    )
    with caplog.at_level(logging.WARNING):
        worker._abort_nccl()
        worker._destroy_process_group()
    assert calls == ["destroy"] and not caplog.records
