"""tests/gpu/ runs only where CUDA is: every test here is marked ``gpu`` and skipped
elsewhere (CI has no GPU; ``bench/gpu_check.sh`` runs them on one)."""

from __future__ import annotations

import importlib.util

import pytest


def _cuda() -> bool:
    if importlib.util.find_spec("torch") is None:
        return False
    import torch

    return torch.cuda.is_available()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    ours = [item for item in items if "tests/gpu/" in item.path.as_posix()]
    skip = None if not ours or _cuda() else pytest.mark.skip(reason="needs a CUDA GPU")
    for item in ours:
        item.add_marker(pytest.mark.gpu)
        if skip is not None:
            item.add_marker(skip)
