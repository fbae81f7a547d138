"""The seed's metric API: ``configure``, ``put_metric``, ``prof`` and metric handlers.

As torch's ``torch.distributed.elastic.metrics``: ``configure(handler, group=None)`` sends
the values of one metric group (or, with no group, of every group without a handler of
its own) to ``handler.emit(MetricData)``; torch's handler objects work as they are. A
plain function ``handler(name, value, group)`` works too. Every running agent in this
process also shows each value on ``/metrics`` as ``agentd_custom_metric{group,name}``.
The agent itself publishes torch's ``workers.<role>.*`` metrics (see
:mod:`agentd.reports.torch_metrics`).
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

log = logging.getLogger(__name__)

DEFAULT_GROUP = "torchelastic"
_F = TypeVar("_F", bound=Callable[..., Any])


@dataclass(frozen=True)
class MetricData:
    """One published value (torch's ``MetricData``)."""

    timestamp: float
    group_name: str
    name: str
    value: float


class MetricHandler(abc.ABC):
    """Where metric values go (torch's ``MetricHandler``)."""

    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None: ...


class NullMetricHandler(MetricHandler):
    """Drops every value."""

    def emit(self, metric_data: MetricData) -> None:
        pass


class ConsoleMetricHandler(MetricHandler):
    """Prints ``[timestamp][group]: name=value``, as torch's console handler."""

    def emit(self, metric_data: MetricData) -> None:
        print(f"[{metric_data.timestamp}][{metric_data.group_name}]: "  # noqa: T201 (its job)
              f"{metric_data.name}={metric_data.value}")  # fmt: skip


class _Function(MetricHandler):
    def __init__(self, function: Callable[[str, float, str], None]) -> None:
        self.function = function

    def emit(self, metric_data: MetricData) -> None:
        self.function(metric_data.name, metric_data.value, metric_data.group_name)


class _LogHandler(MetricHandler):
    def emit(self, metric_data: MetricData) -> None:
        log.debug("metric %s.%s = %s", metric_data.group_name, metric_data.name,
                  metric_data.value)  # fmt: skip


_default: MetricHandler = _LogHandler()
_by_group: dict[str, MetricHandler] = {}
_sinks: list[Callable[[str, float, str], None]] = []


def configure(handler: MetricHandler | Callable[[str, float, str], None],
              group: str | None = None) -> None:  # fmt: skip
    """Send the values of ``group`` (None: of every other group) to ``handler``."""
    global _default
    target: Any = handler
    if not callable(getattr(handler, "emit", None)):  # a plain function
        target = _Function(handler)  # type: ignore[arg-type]
    if group is None:
        _default = target
    else:
        _by_group[group] = target


def getStream(group: str) -> MetricHandler:
    """The handler that ``group``'s values go to."""
    return _by_group.get(group, _default)


def subscribe(sink: Callable[[str, float, str], None]) -> Callable[[], None]:
    """Also send every value to ``sink(name, value, group)`` (a running agent's
    registry); returns the function that unsubscribes it."""
    _sinks.append(sink)
    return lambda: _sinks.remove(sink) if sink in _sinks else None


def put_metric(metric_name: str, metric_value: float, metric_group: str = DEFAULT_GROUP) -> None:
    """Publish one value to its group's handler and to every running agent's registry; a
    failing handler is logged, never raised to the caller."""
    data = MetricData(time.time(), metric_group, metric_name, metric_value)
    try:
        getStream(metric_group).emit(data)
    except Exception:
        log.exception("Metric handler failed for %s.%s", metric_group, metric_name)
    for sink in list(_sinks):
        sink(metric_name, metric_value, metric_group)


def prof(fn: _F | None = None, group: str = DEFAULT_GROUP) -> Any:
    """Decorate a function (sync or async) to publish ``<name>.success`` / ``.failure``
    counts and ``<name>.duration.ms``, as the seed's ``prof`` does."""

    def wrap(func: _F) -> _F:
        name = func.__qualname__

        def report(ok: bool, began: float) -> None:
            put_metric(f"{name}.{'success' if ok else 'failure'}", 1, group)
            put_metric(f"{name}.duration.ms", (time.monotonic() - began) * 1000, group)

        if inspect.iscoroutinefunction(func):

            @functools.wraps(func)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                began = time.monotonic()
                try:
                    result = await func(*args, **kwargs)
                except BaseException:
                    report(False, began)
                    raise
                report(True, began)
                return result

            return async_wrapper  # type: ignore[return-value]

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.monotonic()
            try:
                result = func(*args, **kwargs)
            except BaseException:
                report(False, began)
                raise
            report(True, began)
            return result

        return wrapper  # type: ignore[return-value]

    return wrap(fn) if fn is not None else wrap
