"""aiohttp's private parts: how a runner makes its server, and a request handler's
idle-connection timer (aiohttp ``>=3.12,<3.15``)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aiohttp import web


def runner_class(wrap_server: Callable[[web.Server], Any]) -> type[web.AppRunner]:
    """An ``AppRunner`` whose sites serve ``wrap_server(server)`` instead of its server
    (``AppRunner._make_server``: the one place a runner builds the protocol factory its
    sites listen with)."""
    from aiohttp import web

    class WrappingRunner(web.AppRunner):
        async def _make_server(self) -> web.Server:
            return wrap_server(await super()._make_server())  # type: ignore[no-any-return]

    return WrappingRunner


def keepalive_deferred(handler_class: type, delay: float) -> type:
    """A subclass of aiohttp's ``RequestHandler`` class ``handler_class`` whose
    idle-connection check (``_process_keepalive``) runs ``delay`` seconds after it falls
    due. It adds no slots, so a handler can become one (:func:`become`)."""

    class DeferredKeepalive(handler_class):  # type: ignore[misc,valid-type]
        __slots__ = ()

        def _process_keepalive(self) -> None:
            process = super()._process_keepalive
            asyncio.get_running_loop().call_later(delay, process)

    return DeferredKeepalive


def become(handler: Any, subclass: type) -> None:
    """Make the request handler ``handler`` an instance of ``subclass`` (of its own class,
    with no slots of its own), before it served anything: aiohttp's server builds each
    handler itself and takes no handler class."""
    handler.__class__ = subclass
