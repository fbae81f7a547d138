"""runpy's private part: running a module as ``python -m`` does."""

from __future__ import annotations


def run_module_as_main(name: str) -> None:
    """Run module ``name`` as ``__main__`` with ``sys.argv[0]`` its path, exactly as
    ``python -m name`` does (``runpy._run_module_as_main``, what ``-m`` calls; the public
    ``run_module`` differs in ``sys.modules['__main__']`` and ``sys.argv``)."""
    import runpy

    runpy._run_module_as_main(name, alter_argv=True)  # type: ignore[attr-defined]
