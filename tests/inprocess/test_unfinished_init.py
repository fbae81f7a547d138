"""A restart that interrupts ``init_process_group`` before it made the default group:
the next init in the kept process names its group as a new rank's does."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from tests.conftest import free_port, wait_until

SCRIPT = textwrap.dedent(
    """
    import sys
    from datetime import timedelta

    import torch.distributed as dist

    from agentd.inprocess import teardown

    store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), 2, True, wait_for_workers=False)
    try:  # rank 1 never comes: the init fails as one interrupted would, half done
        dist.init_process_group(
            "gloo", store=store, rank=0, world_size=2, timeout=timedelta(seconds=1)
        )
    except Exception:
        pass
    assert not dist.is_initialized()
    teardown.destroy_process_groups()  # what an in-process restart does before the next call
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


LOST_IN_INIT = textwrap.dedent(
    """
    import os
    import pathlib
    import time
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    import agentd.inprocess as inprocess

    out = pathlib.Path(os.environ.get("TEST_SHARED", os.environ["TEST_AGENTD_OUT"]))
    others = int(os.environ["WORLD_SIZE"]) - 1


    def train():
        rank, attempt = os.environ["RANK"], os.environ["TORCHELASTIC_RESTART_COUNT"]
        # the lost rank dies while the others wait for it in their init
        if rank == os.environ.get("TEST_LOST_RANK", "1") and attempt == "0":
            while len(list(out.glob("init_*"))) < others:
                time.sleep(0.01)
            time.sleep(0.5)
            os._exit(1)
        (out / f"init_{rank}_{attempt}").touch()
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        dist.all_reduce(torch.ones(1))
        dist.destroy_process_group()


    if os.environ.get("TEST_PLAIN"):  # never opts in: its agent parks nothing
        train()
    else:
        inprocess.run(train)
    (out / f"done_{os.environ['RANK']}_{inprocess.current().count}").touch()
    """
)


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_ranks_waiting_in_their_init_for_a_lost_rank_park_at_once(run_agentd, tmp_path):
    """Rank 1 dies while ranks 0, 2 and 3 wait for it in ``init_process_group``, blocked
    in the workers' store (native code: an interruption cannot reach them). The agent
    closes the attempt's store once it has asked them to park: their init fails, they park
    and are kept. Before, they waited in the store until ``--inprocess-park-timeout``
    (10 s), and every rank restarted as a new process (a crash at start; the chaos bench's
    seed 20 met it as a node joined while the others' ranks were in their first init)."""
    pytest.importorskip("torch.distributed")
    script = tmp_path / "lost_in_init.py"
    script.write_text(LOST_IN_INIT)
    agent = run_agentd("--standalone", "--nproc-per-node", "4", "--max-restarts", "1", str(script))
    assert agent.wait(90) == 0, agent.stderr()[-3000:]
    assert "park_timeout" not in agent.stderr(), agent.stderr()[-3000:]
    done = sorted(p.name for p in agent.out_dir.glob("done_*"))
    assert done == ["done_0_1", "done_1_0", "done_2_1", "done_3_1"]  # 0, 2, 3 kept


@pytest.mark.torch
@pytest.mark.timeout(180)
def test_a_rank_waiting_in_its_init_on_a_store_host_that_kept_nothing_parks_at_once(
    run_agentd, run_store, tmp_path
):
    """Two nodes, one rank each. Node 0's agent serves the workers' store; its rank does
    not call ``inprocess.run``, and dies while node 1's rank waits for it in
    ``init_process_group``. Node 0 parks nothing, yet closes its store as it stops: node
    1's rank fails out of its init, parks, and is kept. Before, the store stayed open
    until node 0's next attempt, and node 1 waited out its park timeout (10 s) and
    restarted its rank as a new process (the chaos bench's seed 20: a node joined as the
    store host's workers had just started)."""
    pytest.importorskip("torch.distributed")
    from tests.helpers.jobs import STEADY_MEMBER, TOKEN, agent_args

    script = tmp_path / "lost_in_init.py"
    script.write_text(LOST_IN_INIT)
    shared = tmp_path / "shared"
    shared.mkdir()
    store = run_store()
    flags = agent_args(store.endpoint, "2", "--max-restarts", "1", conf=STEADY_MEMBER)
    env = {"AGENTD_STORE_TOKEN": TOKEN, "TEST_SHARED": str(shared), "TEST_LOST_RANK": "0"}
    host = run_agentd(*flags, str(script), env={**env, "TEST_PLAIN": "1"})
    wait_until(lambda: "joined round 0 as node 0" in host.stderr(), 60, "node 0")
    kept = run_agentd(*flags, str(script), env=env)
    assert [a.wait(120) for a in (host, kept)] == [0, 0], kept.stderr()[-3000:]
    assert "park_timeout" not in kept.stderr(), kept.stderr()[-3000:]
    assert sorted(p.name for p in shared.glob("done_*")) == ["done_0_0", "done_1_1"]
