"""``python -m agentd``: the same as the ``agentd`` command."""

import sys

from agentd.cli import main

sys.exit(main())
