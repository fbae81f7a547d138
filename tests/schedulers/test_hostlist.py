"""Slurm's hostlist syntax, checked against python-hostlist (the reference parser, GPL:
a test dependency only) on the forms Slurm writes."""

from __future__ import annotations

import pytest

from agentd.schedulers.hostlist import HostlistError, expand

hostlist = pytest.importorskip("hostlist")

LISTS = [
    "node01",
    "node[01-04,07]",
    "a[1-2]-ib,b3",
    "gpu-[001-128]",
    "n[8-10]",
    "n[098-101]",
    "r[1-2]n[01-03]",
    "127.0.0.[1-3]",
    "a,b,c",
    "x[1,3,5-6]y,z[0-1]",
    "dgx-a100-[0001-0004],dgx-h100-0007",
    "n[1-3],n2",
]


@pytest.mark.parametrize("text", LISTS)
def test_expands_as_the_reference_parser_does(text):
    assert expand(text) == hostlist.expand_hostlist(text)


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("n[1-3", "leaves a bracket open"),
        ("n1-3]", "closes a bracket it did not open"),
        ("n[[1-2]]", "nests brackets"),
        ("n[3-1]", "runs backwards"),
        ("n[a-b]", "must be numbers or low-high ranges"),
        ("a,,b", "has an empty entry"),
        ("n[1-999999]", "names more than 65536 hosts"),
        ("bad host", "has a space"),
    ],
)
def test_a_list_that_does_not_parse_says_why(text, says):
    with pytest.raises(HostlistError, match=says):
        expand(text)
