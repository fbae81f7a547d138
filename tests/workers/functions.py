"""Python function entrypoints for LocalElasticAgent tests (importable by reference)."""

from __future__ import annotations

import os


def rank_times(factor: int) -> dict[str, int]:
    return {"rank": int(os.environ["RANK"]), "value": int(os.environ["RANK"]) * factor}


def raise_on_rank(bad_rank: int) -> int:
    if int(os.environ["RANK"]) == bad_rank:
        raise RuntimeError(f"function failed on rank {bad_rank}")
    return 0


def in_process(factor: int) -> int:
    """Wraps its work in agentd.inprocess.run, which a function entrypoint cannot honour."""
    import agentd.inprocess as inprocess

    return inprocess.run(lambda: int(os.environ["RANK"]) * factor)
