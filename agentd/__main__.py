"""``python -m agentd`` and the ``agentd`` command.

Garbage collection is paused before anything is imported: a launch allocates only
long-lived objects until its workers run (see :class:`agentd.cli.CollectOnceRunning`).
"""

import gc

gc.disable()

import sys  # noqa: E402

from agentd.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
