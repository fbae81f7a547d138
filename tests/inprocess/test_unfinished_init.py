"""A restart that interrupts ``init_process_group`` before it made the default group:
the next init in the kept process names its group as a new rank's does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import free_port

SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import torch.distributed as dist

    from agentd.inprocess import worker

    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True, wait_for_workers=False)
    try:  # rank 1 never comes: the init fails as one interrupted would, half done
        dist.init_process_group(
            "gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=1)
        )
    except Exception:
        pass
    assert not dist.is_initialized()
    worker._destroy_process_group()  # what an in-process restart does before the next call
    alone = dist.HashStore()
    dist.init_process_group("gloo", store=alone, rank=0, world_size=1)
    print(dist.distributed_c10d._get_default_group().group_name)
    dist.destroy_process_group()
    """
)


def test_the_next_init_names_its_group_as_a_new_ranks_does():
    """``bench/bench_chaos.py --inprocess`` seed 0 (2026-12-03): a node joined as the
    others' workers were still in their first ``init_process_group``; kept for the new
    round, they named their group "1" and the new node's ranks "0", and every rank of
    the round waited on keys the others never wrote until its 60 s timeout."""
    pytest.importorskip("torch.distributed")
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(free_port())],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0"]
