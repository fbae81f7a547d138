"""The store's event loop: uvloop's where installed, asyncio's when asked or missing."""

from __future__ import annotations

import asyncio
import importlib.util
import sys

import pytest

from agentd.exceptions import ConfigError
from agentd.support import fast_loop


async def whose_loop() -> str:
    return fast_loop.loop_name(asyncio.get_running_loop())


def test_asyncio_when_asked_and_uvloop_by_default_where_installed():
    assert fast_loop.run(whose_loop(), "asyncio") == "asyncio"
    installed = importlib.util.find_spec("uvloop") is not None
    assert fast_loop.run(whose_loop()) == ("uvloop" if installed else "asyncio")


def test_uvloop_asked_for_but_missing_is_a_usage_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "uvloop", None)  # importing it fails, as uninstalled
    assert fast_loop.loop_factory("auto") is None
    with pytest.raises(ConfigError, match=r"--loop: 'uvloop' is not installed"):
        fast_loop.run(whose_loop(), "uvloop")
