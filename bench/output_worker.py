"""Writes MIB mebibytes to stdout, in 64 KiB writes: ``lines`` (a newline every KiB),
``bar`` (a tqdm-like redraw ending in \\r every 100 bytes) or ``none`` (no line end)."""

from __future__ import annotations

import sys

mib, mode = int(sys.argv[1]), sys.argv[2]
unit = {
    "lines": b"x" * 1023 + b"\n",
    "bar": (b" 42%|" + b"#" * 40 + b"  | 4242/10000 [00:42<00:58, 100.00it/s]").ljust(99) + b"\r",
    "none": b"x" * 1024,
}[mode]
block = (unit * (65536 // len(unit) + 1))[:65536]
out = sys.stdout.buffer
for _ in range(mib * 16):
    out.write(block)
out.flush()
