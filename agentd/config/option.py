"""One option of ``agentd run``: its field name (also the TOML key), flags, parser, default,
help and environment variables (the tables are in :mod:`agentd.config.options`), and the
``AGENTD_*`` variables no option reads; and the command-line parser the flags go to:
argparse that raises a :class:`ConfigError` instead of exiting (every error one line,
exit 2), suggests the flag meant for a mistyped one, and sizes its help without importing
shutil."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, NamedTuple, NoReturn

from agentd.exceptions import ConfigError

ENV_PREFIXES = ("AGENTD_", "PET_")
RDZV_BACKENDS = ("static", "agentd", "c10d", "etcd", "etcd-v2")
LOG_FORMATS = ("text", "json")
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


class Option(NamedTuple):
    """One setting: its field name (also the TOML key), its flags, parser and default."""

    name: str
    flags: tuple[str, ...]
    parse: Callable[[str], Any]
    default: str
    help: str
    is_flag: bool = False
    metavar: str | None = None
    torch_env: str | tuple[str, ...] | None = None
    """torch variables that also set this option, after ``AGENTD_*`` and ``PET_*``."""
    repeatable: bool = False
    """The flag may be given more than once; the values are joined with ``separator``."""
    separator: str = ","

    @property
    def env_names(self) -> tuple[str, ...]:
        names = tuple(prefix + self.name.upper() for prefix in ENV_PREFIXES)
        extra = (self.torch_env,) if isinstance(self.torch_env, str) else self.torch_env or ()
        return (*names, *extra)


def option(
    name: str,
    parse: Callable[[str], Any],
    default: str,
    help: str,
    *extra: str,
    is_flag: bool = False,
    metavar: str | None = None,
    torch_env: str | tuple[str, ...] | None = None,
    repeatable: bool = False,
    separator: str = ",",
) -> Option:
    dashed = "--" + name.replace("_", "-")
    flags = [dashed] + (["--" + name] if "_" in name else []) + list(extra)
    return Option(
        name, tuple(flags), parse, default, help, is_flag, metavar, torch_env, repeatable, separator
    )


OTHER_VARIABLES = frozenset(
    {
        # read by the commands beside ``agentd run``'s options
        "AGENTD_CONFIG",  # --config
        "AGENTD_STATUS_URL",  # agentd status / drain / logs
        "AGENTD_HEALTH_CACERT",  # agentd status / drain / logs over TLS
        "AGENTD_ETCD_PASSWORD",  # the etcd store's password, never on a command line
        # set by the agent for its workers and guardian (an agent a worker starts has them)
        "AGENTD_ATTEMPT",
        "AGENTD_CONTROL_FILE",
        "AGENTD_DUMP_SIGNAL",
        "AGENTD_INPROCESS_FD",
        "AGENTD_INPROCESS_FRESH",
        "AGENTD_INPROCESS_GRACE",
        "AGENTD_INPROCESS_NCCL_ABORT",
        "AGENTD_INPROCESS_REPLACED",
        "AGENTD_INPROCESS_ROUND",
        "AGENTD_INPROCESS_SOURCE",
        "AGENTD_INPROCESS_STALE",
        "AGENTD_OWNER",
        "AGENTD_PROGRESS_PIPE",
        "AGENTD_REHEARSAL",
        "AGENTD_RELEASE_FDS",
        "AGENTD_STACK_FILE",
        "AGENTD_SYNC_ROUTE",
    }
)
"""Every ``AGENTD_*`` name agentd reads or sets that is not an option's own
(``tests/config/test_variables.py`` checks that the source holds no other)."""


def unknown_variables(environ: Mapping[str, str], options: Iterable[Option]) -> Iterator[str]:
    """One line for each ``AGENTD_*`` variable of ``environ`` that is neither one of
    ``options``' nor in :data:`OTHER_VARIABLES`, in name order, with the known name closest
    to it. A mistyped ``AGENTD_NPROC_PER_NOD=4`` was ignored in silence (the job ran with
    the default); the commands warn of each and go on, as a variable of a newer agentd must
    not stop an older one. ``PET_*`` variables are torch's too, which ignores its unknown
    ones, so they are not checked."""
    prefix = ENV_PREFIXES[0]
    given = sorted(name for name in environ if name.startswith(prefix))
    known = OTHER_VARIABLES.union(n for o in options for n in o.env_names if n.startswith(prefix))
    for name in given:
        if name in known:
            continue
        import difflib  # only for a name nobody knows

        # the shared prefix would make any two names look alike: the rest is compared
        rests = {known_name.removeprefix(prefix): known_name for known_name in known}
        close = difflib.get_close_matches(name.removeprefix(prefix), sorted(rests), 1, 0.8)
        hint = f" (did you mean {rests[close[0]]}?)" if close else ""
        yield f"{name} is not a variable agentd reads: ignored{hint}"


class Formatter(argparse.HelpFormatter):
    """argparse's help layout, sized without importing shutil.

    argparse builds a formatter per option it adds (to check the metavar), and each one it
    sizes through ``shutil.get_terminal_size``: importing shutil and asking the terminal 90
    times was most of the time ``agentd run`` spent building its parser."""

    def __init__(
        self,
        prog: str,
        indent_increment: int = 2,
        max_help_position: int = 24,
        width: int | None = None,
    ) -> None:
        super().__init__(prog, indent_increment, max_help_position, width or _columns() - 2)


@functools.cache
def _columns() -> int:
    """The terminal's width as shutil finds it: $COLUMNS, else stdout's terminal, else 80."""
    with contextlib.suppress(KeyError, ValueError):
        if (columns := int(os.environ["COLUMNS"])) > 0:
            return columns
    stdout = sys.__stdout__
    if stdout is not None:
        with contextlib.suppress(AttributeError, ValueError, OSError):
            return os.get_terminal_size(stdout.fileno()).columns or 80
    return 80


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so every error is one line and exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.flags: set[str] = set()
        """This parser's own ``--flag`` spellings."""
        self._commands: dict[str, Parser] = {}
        self._argv: list[str] = []
        kwargs.setdefault("formatter_class", Formatter)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        action = super().add_argument(*args, **kwargs)
        self.flags.update(flag for flag in action.option_strings if flag.startswith("--"))
        return action

    def add_subparsers(self, **kwargs: Any) -> Any:
        commands = super().add_subparsers(**kwargs)
        self._commands = commands.choices
        return commands

    def parse_args(self, args: Any = None, namespace: Any = None) -> Any:
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        raise ConfigError(message + self._suggestion(message))

    def _suggestion(self, message: str) -> str:
        """For an unknown ``--flag``: the flag meant, when one of the command's own flags
        is close (a typo). argparse reports a command's unknown flags here, at the top
        parser, so the command is found in the arguments."""
        import difflib

        prefix = "unrecognized arguments: "
        if not message.startswith(prefix):
            return ""
        command = next((word for word in self._argv if not word.startswith("-")), "")
        flags = sorted(self._commands[command].flags if command in self._commands else self.flags)
        hints = []
        for word in message[len(prefix) :].split():
            flag = word.split("=", 1)[0]
            close = difflib.get_close_matches(flag, flags, n=1, cutoff=0.8)
            if flag.startswith("--") and close and close[0] != flag:
                hints.append((flag, close[0]))
        if len(hints) == 1:
            return f" (did you mean {hints[0][1]}?)"
        return f" (did you mean {', '.join(f'{c} for {f}' for f, c in hints)}?)" if hints else ""
