"""Write tests/long_tests.txt from a pytest run's ``--durations=0`` output (on stdin):
every test (parameters folded) whose setup, call or teardown took 4 s or more, longest
first. The conftest runs these first (see its ``pytest_collection_modifyitems``)."""

from __future__ import annotations

import re
import sys

LONG = 4.0
LINE = re.compile(r"([\d.]+)s (?:setup|call|teardown)\s+(\S+)")
HEADER = """\
# The suite's longest tests (4 s or more in a run on 2 cores), longest first: the
# conftest runs them first, so xdist hands them out to every worker at the start instead
# of leaving a long one for the end. Refresh from a run's --durations=0 output with
#   python tests/long_tests.py < pytest-output.txt > tests/long_tests.txt
"""


def main() -> None:
    longest: dict[str, float] = {}
    for line in sys.stdin:
        if match := LINE.match(line):
            name = match.group(2).split("[")[0]
            longest[name] = max(longest.get(name, 0.0), float(match.group(1)))
    names = sorted((n for n, t in longest.items() if t >= LONG), key=lambda n: -longest[n])
    sys.stdout.write(HEADER + "".join(f"{name}\n" for name in names))


if __name__ == "__main__":
    main()
