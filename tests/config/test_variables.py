"""``AGENTD_*`` variables agentd does not read are named, with the known name closest to them."""

from __future__ import annotations

import re
from pathlib import Path

from agentd.config.option import OTHER_VARIABLES, unknown_variables
from agentd.config.options import OPTIONS

SOURCE = Path(__file__).parents[2] / "agentd"
NAME = re.compile(r"\bAGENTD_[A-Z0-9_]*[A-Z0-9]\b")


def _names_in_source() -> set[str]:
    """The names the code reads or sets (the list itself, where they are all, left out)."""
    files = (p for p in SOURCE.rglob("*.py") if p != SOURCE / "config" / "option.py")
    return {m.group() for p in files for m in NAME.finditer(p.read_text())}


def test_every_variable_the_source_names_is_known_and_every_other_one_is_in_the_source():
    """A variable added to the code and not to the list would be warned of as unknown; one
    left in the list after the code dropped it would hide a typo of a dead name."""
    in_source = _names_in_source()
    options = {name for o in OPTIONS for name in o.env_names if name.startswith("AGENTD_")}
    assert in_source - options - OTHER_VARIABLES == set()
    assert OTHER_VARIABLES - in_source == set()


def test_an_unknown_variable_is_named_with_the_closest_known_one():
    environ = {
        "AGENTD_NPROC_PER_NOD": "4",
        "AGENTD_QWERTY": "1",
        "AGENTD_MAX_RESTARTS": "3",  # an option's
        "AGENTD_STATUS_URL": "http://127.0.0.1:1",  # a command's
        "AGENTD_ATTEMPT": "0",  # a worker's (an agent started by a worker inherits it)
        "PET_NPROC_PER_NOD": "4",  # torchrun's namespace: torch ignores its unknowns too
        "HOME": "/root",
    }
    assert list(unknown_variables(environ, OPTIONS)) == [
        "AGENTD_NPROC_PER_NOD is not a variable agentd reads: ignored "
        "(did you mean AGENTD_NPROC_PER_NODE?)",
        "AGENTD_QWERTY is not a variable agentd reads: ignored",
    ]
    assert list(unknown_variables({"HOME": "/root"}, OPTIONS)) == []
