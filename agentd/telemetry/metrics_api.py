"""The seed's metric API: ``configure``, ``put_metric``, ``prof`` and metric handlers.

As torch's ``torch.distributed.elastic.metrics`` (and its ``.api``, which is this module):
``configure(handler, group=None)`` sends the values of one metric group (or, with no group,
of every group without a handler of its own) to ``handler.emit(MetricData)``; torch's
handler objects work as they are. A plain function ``handler(name, value, group)`` works
too. ``put_metric`` goes through ``getStream(group).add_value``, looked up at each call, so
patching ``getStream`` here redirects every value, as in torch. Every running agent in this
process also shows each value on ``/metrics`` as ``agentd_custom_metric{group,name}``.
The agent itself publishes torch's ``workers.<role>.*`` metrics (see
:mod:`agentd.agent.torch_internals`).
"""

from __future__ import annotations

import abc
import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, TypeVar

log = logging.getLogger(__name__)

DEFAULT_GROUP = "torchelastic"
_F = TypeVar("_F", bound=Callable[..., Any])


class MetricData:
    """One published value (torch's ``MetricData``: a plain record, as torch's is; not a
    dataclass, whose generated methods would cost every launch half a millisecond)."""

    __slots__ = ("group_name", "name", "timestamp", "value")

    def __init__(self, timestamp: float, group_name: str, name: str, value: float) -> None:
        self.timestamp = timestamp
        self.group_name = group_name
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return (
            f"MetricData(timestamp={self.timestamp!r}, group_name={self.group_name!r}, "
            f"name={self.name!r}, value={self.value!r})"
        )


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
        line = f"[{metric_data.timestamp}][{metric_data.group_name}]: "
        print(line + f"{metric_data.name}={metric_data.value}")  # noqa: T201 (its job)


class _Function(MetricHandler):
    def __init__(self, function: Callable[[str, float, str], None]) -> None:
        self.function = function

    def emit(self, metric_data: MetricData) -> None:
        self.function(metric_data.name, metric_data.value, metric_data.group_name)


class _LogHandler(MetricHandler):
    def emit(self, metric_data: MetricData) -> None:
        log.debug("metric %s.%s = %s", metric_data.group_name, metric_data.name, metric_data.value)


_default: MetricHandler = _LogHandler()
_by_group: dict[str, MetricHandler] = {}
_sinks: list[Callable[[str, float, str], None]] = []


def configure(
    handler: MetricHandler | Callable[[str, float, str], None], group: str | None = None
) -> None:
    """Send the values of ``group`` (None: of every other group) to ``handler``."""
    global _default
    target: Any = handler
    if not callable(getattr(handler, "emit", None)):  # a plain function
        target = _Function(handler)  # type: ignore[arg-type]
    if group is None:
        _default = target
    else:
        _by_group[group] = target


class MetricStream:
    """One group's values, on their way to a handler (torch's ``MetricStream``)."""

    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: float) -> None:
        self.handler.emit(MetricData(time.time(), self.group_name, metric_name, metric_value))


class MetricsConfig:
    """torch's metrics configuration (``params`` for a handler); agentd needs none."""

    __slots__ = ("params",)

    def __init__(self, params: dict[str, str] | None = None) -> None:
        self.params = params


def initialize_metrics(cfg: MetricsConfig | None = None) -> None:
    """torch's hook for a metrics backend; the handlers given to :func:`configure` are
    agentd's backend, so there is nothing to set up."""


def getStream(group: str) -> MetricStream:
    """The stream that ``group``'s values go through (to its configured handler)."""
    return MetricStream(group, _by_group.get(group, _default))


def subscribe(sink: Callable[[str, float, str], None]) -> Callable[[], None]:
    """Also send every value to ``sink(name, value, group)`` (a running agent's
    registry); returns the function that unsubscribes it."""
    _sinks.append(sink)
    return lambda: _sinks.remove(sink) if sink in _sinks else None


def put_metric(metric_name: str, metric_value: float, metric_group: str = DEFAULT_GROUP) -> None:
    """Publish one value to its group's handler and to every running agent's registry; a
    failing handler is logged, never raised to the caller."""
    try:
        getStream(metric_group).add_value(metric_name, metric_value)
    except Exception:
        log.exception("Metric handler failed for %s.%s", metric_group, metric_name)
    for sink in list(_sinks):
        sink(metric_name, metric_value, metric_group)


def publish_metric(metric_group: str, metric_name: str, metric_value: float) -> None:
    """torch's older spelling of :func:`put_metric` (group first)."""
    put_metric(metric_name, metric_value, metric_group)


def get_elapsed_time_ms(start_time_in_seconds: float) -> int:
    """Milliseconds since ``start_time_in_seconds`` (epoch seconds)."""
    return int((time.time() - start_time_in_seconds) * 1000)


def _get_metric_name(fn: Callable[..., Any]) -> str:
    """``Class.method`` for a method, ``module.function`` for a function (torch's names)."""
    qualname = fn.__qualname__
    if "." in qualname:
        return qualname
    module = getattr(fn, "__module__", "") or ""
    return f"{module.rsplit('.', 1)[-1]}.{qualname}" if module else qualname


def profile(group: str | None = None) -> Callable[[_F], _F]:
    """torch's older decorator: ``<function>.success`` / ``.failure`` and ``.duration.ms``
    under the function's bare name."""

    def wrap(func: _F) -> _F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            began = time.time()
            try:
                result = func(*args, **kwargs)
                put_metric(f"{func.__name__}.success", 1, group or DEFAULT_GROUP)
            except Exception:
                put_metric(f"{func.__name__}.failure", 1, group or DEFAULT_GROUP)
                raise
            finally:
                put_metric(
                    f"{func.__name__}.duration.ms",
                    get_elapsed_time_ms(began),
                    group or DEFAULT_GROUP,
                )
            return result

        return wrapper  # type: ignore[return-value]

    return wrap


def prof(fn: _F | None = None, group: str = DEFAULT_GROUP) -> Any:
    """Decorate a function (sync or async) to publish ``<name>.success`` / ``.failure``
    counts and ``<name>.duration.ms``, as the seed's ``prof`` does (``<name>`` as
    :func:`_get_metric_name`)."""

    def wrap(func: _F) -> _F:
        name = _get_metric_name(func)

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
