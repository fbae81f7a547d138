"""Where the workers' output and error files go: torch's ``LogsSpecs``, ``DefaultLogsSpecs``
and ``LogsDest``.

A :class:`LogsSpecs` holds the settings (``log_dir``, ``redirects``, ``tee``,
``local_ranks_filter``) and answers :meth:`~LogsSpecs.reify`: given the environment of
each local rank, the paths of their output and error files, as a :class:`LogsDest`. The
default layout is agentd's (and torch's, without its random suffix):
``<log_dir>/<run_id>/attempt_<n>/<local_rank>/{stdout.log,stderr.log,error.json}``.

A subclass that overrides ``reify`` decides the paths itself, as it does under torch:
``start_processes`` and ``LocalElasticAgent`` write each worker's streams where its
``LogsDest`` says ("" for the console, ``os.devnull`` for nowhere) and give each worker
the ``TORCHELASTIC_ERROR_FILE`` that ``reify`` set in its environment.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentd.errors.error_file import ERROR_FILE_ENV
from agentd.spec import Std, std_for
from agentd.workers.output import StreamRoute, plan_route

CONSOLE = ""
"""A :class:`LogsDest` path that means the console (the stream is not redirected)."""


@dataclass
class LogsDest:
    """Paths by local rank: ``stdouts``/``stderrs`` where each stream goes (``""``: the
    console), ``tee_stdouts``/``tee_stderrs`` the streams also copied to the console,
    ``error_files`` each worker's error file; ``filtered_*`` the files of the lines that
    ``duplicate_std*_filters`` pick."""

    stdouts: dict[int, str] = field(default_factory=dict)
    stderrs: dict[int, str] = field(default_factory=dict)
    tee_stdouts: dict[int, str] = field(default_factory=dict)
    tee_stderrs: dict[int, str] = field(default_factory=dict)
    error_files: dict[int, str] = field(default_factory=dict)
    filtered_stdout: str = ""
    filtered_stderr: str = ""


class LogsSpecs:
    """The workers' output settings (see the module). ``log_dir``: the root of the layout
    (None: a private temporary directory, made when first needed); ``redirects``, ``tee``
    and ``local_ranks_filter``: the worker spec's fields of those names."""

    def __init__(
        self,
        log_dir: str | None = None,
        redirects: Std | dict[int, Std] = Std.NONE,
        tee: Std | dict[int, Std] = Std.NONE,
        local_ranks_filter: set[int] | None = None,
    ) -> None:
        self._root_log_dir = log_dir  # torch's attribute names: a subclass may read them
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = (
            frozenset(local_ranks_filter) if local_ranks_filter is not None else None
        )

    @property
    def root_log_dir(self) -> str | None:
        return self._root_log_dir

    @property
    def redirects(self) -> Std | dict[int, Std]:
        return self._redirects

    @property
    def tee(self) -> Std | dict[int, Std]:
        return self._tee

    @property
    def local_ranks_filter(self) -> frozenset[int] | None:
        """The local ranks whose output reaches the console (None: all)."""
        return self._local_ranks_filter

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        """The files of the local ranks whose environments are ``envs`` (one attempt):
        ``<log_dir>/<TORCHELASTIC_RUN_ID>/attempt_<TORCHELASTIC_RESTART_COUNT>/<rank>/``,
        made here; sets ``TORCHELASTIC_ERROR_FILE`` in each environment. A ``log_dir`` of
        ``os.devnull`` makes no file: the output stays on the console, and no worker has
        an error file (as torch's)."""
        ranks = sorted(envs)
        if self._root_log_dir == os.devnull:  # no files: the console, and no error file
            for rank in ranks:
                envs[rank][ERROR_FILE_ENV] = ""
            console = dict.fromkeys(ranks, CONSOLE)
            return LogsDest(console, dict(console), error_files=dict.fromkeys(ranks, os.devnull))
        if self._root_log_dir is None:
            from agentd.support.tempdirs import private_dir

            self._root_log_dir = private_dir("agentd_")
        first = envs[ranks[0]] if ranks else {}
        attempt = os.path.join(
            self._root_log_dir,
            first.get("TORCHELASTIC_RUN_ID", "none"),
            f"attempt_{first.get('TORCHELASTIC_RESTART_COUNT', '0')}",
        )
        dest = LogsDest(
            filtered_stdout=os.path.join(attempt, "filtered_stdout.log"),
            filtered_stderr=os.path.join(attempt, "filtered_stderr.log"),
        )
        for rank in ranks:
            folder = os.path.join(attempt, str(rank))
            os.makedirs(folder, exist_ok=True)
            self._place(dest, rank, folder)
            envs[rank][ERROR_FILE_ENV] = dest.error_files[rank]
        return dest

    def _place(self, dest: LogsDest, rank: int, folder: str) -> None:
        tee = std_for(self.tee, rank)
        filed = std_for(self.redirects, rank) | tee  # a teed stream is read from its file
        shown = self.local_ranks_filter is None or rank in self.local_ranks_filter
        for std, files, tees, name in (
            (Std.OUT, dest.stdouts, dest.tee_stdouts, "stdout.log"),
            (Std.ERR, dest.stderrs, dest.tee_stderrs, "stderr.log"),
        ):
            path = os.path.join(folder, name) if filed & std else CONSOLE
            files[rank] = path if path or shown else os.devnull
            if tee & std and shown:
                tees[rank] = path
        dest.error_files[rank] = os.path.join(folder, "error.json")


class DefaultLogsSpecs(LogsSpecs):
    """torch's default :class:`LogsSpecs` (the same thing here)."""


def overrides_reify(specs: LogsSpecs | None) -> bool:
    """Whether ``specs`` decides its paths itself: a subclass with its own ``reify``, or
    torch's own log specs (any of its classes)."""
    return specs is not None and type(specs).reify is not LogsSpecs.reify


def output_settings(
    specs: object,
) -> tuple[Std | dict[int, Std], Std | dict[int, Std], frozenset[int] | None]:
    """``(redirects, tee, local_ranks_filter)`` of log specs, agentd's or torch's (its
    ``Std`` has the same values as agentd's)."""
    if isinstance(specs, LogsSpecs):
        return specs.redirects, specs.tee, specs.local_ranks_filter
    from agentd.support.compat.torch import logs_specs_settings

    redirects, tee, chosen = logs_specs_settings(specs)
    return std_as(redirects), std_as(tee), frozenset(chosen) if chosen is not None else None


def std_as(value: Any, std: Any = Std) -> Any:
    """An output setting (a ``Std``, or one per local rank) as the ``Std`` type ``std``:
    agentd's and torch's have the same values, and each library's code knows its own."""
    if isinstance(value, dict):
        return {int(rank): std(int(each)) for rank, each in value.items()}
    return std(int(value))


def dest_routes(
    dest: LogsDest,
    rank: int,
    prefix: str,
    times_of: tuple[int, int] | None = None,
    duplicate_filters: tuple[tuple[str, ...], tuple[str, ...]] = ((), ()),
) -> list[StreamRoute]:
    """Local rank ``rank``'s stdout and stderr routes where ``dest`` puts them: a path
    (with a prefixed copy to the console where teed), the console (``""``) or nowhere
    (``os.devnull``); ``times_of`` and ``duplicate_filters`` as for
    :func:`~agentd.workers.output.plan_route`."""
    routes = []
    for files, tees, filtered, filters, is_stderr in (
        (dest.stdouts, dest.tee_stdouts, dest.filtered_stdout, duplicate_filters[0], False),
        (dest.stderrs, dest.tee_stderrs, dest.filtered_stderr, duplicate_filters[1], True),
    ):
        path = files.get(rank, CONSOLE)
        filed = path not in (CONSOLE, os.devnull)
        routes.append(
            plan_route(
                redirect=filed,
                tee=filed and rank in tees,
                shown=path != os.devnull,
                is_stderr=is_stderr,
                file_path=Path(path if filed else os.devnull),
                prefix=prefix,
                duplicate_filters=filters,
                duplicate_path=Path(filtered) if filtered else None,
                times_of=times_of,
            )
        )
    return routes
