"""A standby's CUDA start-up (``--standby-cuda``) where there is no GPU to start: it does
nothing and says nothing where torch is not preloaded or sees no device, and one line on
stderr where the start-up fails. On a GPU, tests/gpu/ holds what it makes."""

from __future__ import annotations

import sys
import types

import pytest

from agentd.preload.warm_cuda import warm_cuda


def test_nothing_without_torch_preloaded(monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert warm_cuda(0) is None
    assert capsys.readouterr().err == ""


def test_nothing_where_torch_sees_no_gpu(capsys):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible: tests/gpu/ covers it")
    assert warm_cuda(3) is None
    assert not torch.cuda.is_initialized()
    assert capsys.readouterr().err == ""


def test_a_failed_start_is_one_line_and_the_standby_goes_on_cold(monkeypatch, capsys):
    def refuse() -> None:
        raise RuntimeError("CUDA error: out of memory")

    cuda = types.SimpleNamespace(
        is_available=lambda: True,
        device_count=lambda: 2,
        synchronize=refuse,
    )

    class Device:
        def __init__(self, index: int) -> None:
            self.index = index

        def __enter__(self) -> None:
            chosen.append(self.index)

        def __exit__(self, *exc: object) -> None:
            return None

    chosen: list[int] = []
    cuda.device = Device
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(cuda=cuda))
    assert warm_cuda(3) is None
    assert chosen == [1]  # slot 3 of 2 devices: cuda:1
    err = capsys.readouterr().err
    assert err == (
        "agentd: standby worker 3: CUDA could not be started ahead (RuntimeError: CUDA "
        "error: out of memory); its worker starts CUDA itself\n"
    )
    cuda.synchronize = lambda: None
    assert warm_cuda(4) == 0 and chosen == [1, 0]
