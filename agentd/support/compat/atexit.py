"""atexit's private part: running the exit handlers before the interpreter would."""

from __future__ import annotations


def run_exit_functions() -> None:
    """Run (and clear) the functions registered with ``atexit``, as the interpreter does
    on its way out (``atexit._run_exitfuncs``), for a process that leaves by ``os._exit``."""
    import atexit

    atexit._run_exitfuncs()
