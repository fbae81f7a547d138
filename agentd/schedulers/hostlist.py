"""Slurm's hostlist syntax (``node[01-04,07]``, ``a[1-2]-ib,b3``, ``gpu-[001-128]``)
expanded into host names, in order.

A list is comma-separated; each entry is text with any number of bracketed ranges, each
range a comma-separated list of numbers or ``low-high`` spans, whose zero padding is kept
(``[08-10]`` gives ``08 09 10``). Entries expand as Slurm expands them: the last bracket
varies fastest. python-hostlist implements the same syntax but is GPL-2+, which an
Apache-2.0 runtime cannot depend on; the tests check this parser against it.
"""

from __future__ import annotations

import re

MAX_HOSTS = 65536
"""The most hosts one list may expand to (a typo like ``[1-99999999]`` fails fast)."""

_SPAN = re.compile(r"(\d+)(?:-(\d+))?")


class HostlistError(ValueError):
    """A hostlist that does not parse; the message says where."""


def expand(text: str) -> list[str]:
    """Every host of ``text``, in Slurm's order, each once."""
    hosts: list[str] = []
    for entry in _split_top_level(text.strip()):
        if not entry:
            raise HostlistError(f"{text!r} has an empty entry")
        hosts.extend(_expand_entry(entry))
        if len(hosts) > MAX_HOSTS:
            raise HostlistError(f"{text!r} names more than {MAX_HOSTS} hosts")
    return list(dict.fromkeys(hosts))


def _split_top_level(text: str) -> list[str]:
    """Split at the commas outside brackets."""
    entries, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char == "[":
            depth += 1
            if depth > 1:
                raise HostlistError(f"{text!r} nests brackets")
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise HostlistError(f"{text!r} closes a bracket it did not open")
        elif char == "," and depth == 0:
            entries.append(text[start:index])
            start = index + 1
    if depth:
        raise HostlistError(f"{text!r} leaves a bracket open")
    entries.append(text[start:])
    return entries


def _expand_entry(entry: str) -> list[str]:
    names = [""]
    rest = entry
    while rest:
        head, bracket, tail = rest.partition("[")
        if any(c.isspace() for c in head):
            raise HostlistError(f"{entry!r} has a space in a host name")
        names = [name + head for name in names]
        if not bracket:
            break
        inside, _, rest = tail.partition("]")
        numbers = _numbers(inside, entry)
        if len(names) * len(numbers) > MAX_HOSTS:
            raise HostlistError(f"{entry!r} names more than {MAX_HOSTS} hosts")
        names = [name + number for name in names for number in numbers]
    return names


def _numbers(ranges: str, entry: str) -> list[str]:
    """``01-03,07`` into ``01 02 03 07``, keeping the low end's zero padding."""
    numbers: list[str] = []
    for part in ranges.split(","):
        match = _SPAN.fullmatch(part.strip())
        if not match:
            raise HostlistError(f"{entry!r}: [{ranges}] must be numbers or low-high ranges")
        low_text, high_text = match.group(1), match.group(2)
        if high_text is None:
            numbers.append(low_text)
            continue
        low, high = int(low_text), int(high_text)
        if high < low:
            raise HostlistError(f"{entry!r}: range {part.strip()} runs backwards")
        if high - low >= MAX_HOSTS:
            raise HostlistError(f"{entry!r} names more than {MAX_HOSTS} hosts")
        width = len(low_text)
        numbers.extend(str(n).zfill(width) for n in range(low, high + 1))
    return numbers
