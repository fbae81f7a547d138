"""Rendezvous handlers built from Python, as torch's ``rendezvous.registry`` builds them.

``get_rendezvous_handler(RendezvousParameters(backend, endpoint, run_id, min_nodes,
max_nodes, **conf))`` returns agentd's handler for ``c10d``/``agentd``, ``etcd``/
``etcd-v2`` and ``static``, checked as ``agentd run`` checks the same settings (``conf``
is what ``--rdzv-conf`` takes), except that a key the backend does not use is ignored, as
torch ignores it. A handler object of another kind, such as a
site's own torch ``RendezvousHandler`` with synchronous methods, is accepted wherever a
handler is (see :func:`as_agentd_handler`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from agentd.exceptions import ConfigError
from agentd.rendezvous.api import RendezvousHandler

log = logging.getLogger(__name__)

BACKENDS = ("c10d", "agentd", "etcd", "etcd-v2", "static")


class RendezvousParameters:
    """torch's rendezvous parameters: the backend, its endpoint, the run id, the node
    range, this node's address, and backend settings as keyword arguments."""

    def __init__(
        self,
        backend: str,
        endpoint: str,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        local_addr: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        if min_nodes < 1:
            raise ValueError(
                f"The minimum number of rendezvous nodes ({min_nodes}) must be greater than zero."
            )
        if max_nodes < min_nodes:
            raise ValueError(
                f"The maximum number of rendezvous nodes ({max_nodes}) must be "
                f"greater than or equal to the minimum ({min_nodes})."
            )
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.local_addr = local_addr
        self.config = kwargs

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: bool | None = None) -> bool | None:
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        text = str(value).strip().lower()
        if text in ("1", "true", "t", "yes", "y"):
            return True
        if text in ("0", "false", "f", "no", "n"):
            return False
        raise ValueError(
            f"The rendezvous configuration option '{key}' does not represent a valid boolean value."
        )

    def get_as_int(self, key: str, default: int | None = None) -> int | None:
        value = self.get(key, default)
        if value is None:
            return value
        try:
            return int(value)
        except ValueError as exc:
            raise ValueError(
                f"The rendezvous configuration option '{key}' does not "
                "represent a valid integer value."
            ) from exc


RendezvousHandlerCreator = Callable[[RendezvousParameters], Any]
"""What :meth:`RendezvousHandlerRegistry.register` takes: a backend's handler from the
parameters (torch's name)."""


class RendezvousHandlerRegistry:
    """Backends added by name (torch's registry): ``register(backend, creator)`` where
    ``creator(params)`` returns a handler. A registered name takes precedence over
    agentd's own backends of that name."""

    def __init__(self) -> None:
        self._creators: dict[str, RendezvousHandlerCreator] = {}

    def register(self, backend: str, creator: RendezvousHandlerCreator) -> None:
        if not backend:
            raise ValueError("backend: must be a non-empty name")
        current = self._creators.get(backend)
        if current is not None and current is not creator:
            raise ValueError(f"backend: {backend!r} is already registered with {current!r}")
        self._creators[backend] = creator

    def create_handler(self, params: RendezvousParameters) -> Any:
        return get_rendezvous_handler(params)

    def creator(self, backend: str) -> RendezvousHandlerCreator | None:
        return self._creators.get(backend)


rendezvous_handler_registry = RendezvousHandlerRegistry()


def get_rendezvous_handler(params: RendezvousParameters) -> Any:
    """The handler for ``params``: a registered backend's, or agentd's own under torch's
    synchronous face (:class:`~agentd.rendezvous.torch_facade.TorchRendezvousHandler`;
    the agent drives the async handler behind it). A ConfigError names a bad setting.

    As torch's registry, a setting the backend does not use (``is_host`` for etcd,
    ``join_timeout`` for static, ...) is ignored, and said so in the log; ``agentd run
    --rdzv-conf`` refuses such a key instead."""
    from agentd.rendezvous.torch_facade import TorchRendezvousHandler

    creator = rendezvous_handler_registry.creator(params.backend)
    if creator is not None:
        return creator(params)
    return TorchRendezvousHandler(agentd_handler(params))


def agentd_handler(params: RendezvousParameters) -> RendezvousHandler:
    """agentd's own (async) handler for ``params``, unknown settings ignored (see above)."""
    from agentd.rendezvous.conf import UnknownSetting

    conf = dict(params.config)
    while True:
        try:
            return _build_handler(params, conf)
        except UnknownSetting as exc:
            log.info(
                "Rendezvous setting %r is not used by the %s backend; ignoring it",
                exc.key,
                params.backend,
            )
            del conf[exc.key]


def _build_handler(params: RendezvousParameters, conf: dict[str, Any]) -> RendezvousHandler:
    from agentd.rendezvous.build import RendezvousRequest, build_rendezvous

    if params.backend not in BACKENDS:
        raise ConfigError(
            f"backend: {params.backend!r} is not a rendezvous backend here; "
            f"known: {', '.join(BACKENDS)}"
        )
    request = RendezvousRequest(
        nnodes=(params.min_nodes, params.max_nodes),
        rdzv_backend=params.backend,
        rdzv_endpoint=params.endpoint,  # static: where the workers meet (static_master)
        rdzv_conf=",".join(f"{k}={v}" for k, v in conf.items() if k != "rank"),
        node_rank=int(conf.get("rank", 0)),
        local_addr=params.local_addr,
    )
    return build_rendezvous(request, params.run_id, local_world_size=1)


def as_agentd_handler(handler: Any) -> RendezvousHandler:
    """``handler`` itself if it is agentd's kind (async), the handler behind it for
    torch's face of one, else an adapter that drives its synchronous, torch-style methods
    off the loop."""
    from agentd.rendezvous.api import is_agentd_handler
    from agentd.rendezvous.foreign import SyncRendezvousHandler
    from agentd.rendezvous.torch_facade import TorchRendezvousHandler

    if isinstance(handler, TorchRendezvousHandler):
        return handler.handler
    return handler if is_agentd_handler(handler) else SyncRendezvousHandler(handler)
