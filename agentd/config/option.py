"""One option of ``agentd run``: its field name (also the TOML key), flags, parser, default,
help and environment variables (the tables are in :mod:`agentd.config.options`); and the
command-line parser the flags go to: argparse that raises a :class:`ConfigError` instead
of exiting (every error one line, exit 2), suggests the flag meant for a mistyped one, and
sizes its help without importing shutil."""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import sys
from collections.abc import Callable
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
