"""The survivors' tensors handed to new ranks: the plan, which tensors are mapped from
GPU memory, the segment's layout, and two real gloo ranks through each route (shared
memory, CUDA IPC where there is a GPU, and the fallbacks to the group)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentd.inprocess import handover
from agentd.inprocess.cuda_ipc import mapped_by
from agentd.inprocess.handover import Peer, Written, plan
from agentd.support import tempdirs
from tests.conftest import TESTS
from tests.helpers.lock_holder import lock_holder


def peer(place: str | None, digest: float = 1.0) -> Peer:
    return Peer(place, digest, 100, "t")


def test_each_receiver_reads_from_the_lowest_holder_of_the_state_on_its_host():
    peers = [peer("a"), peer("a"), peer("a"), peer("b", 2.0), peer("b"), peer("b")]
    # rank 2 is new, rank 3 drifted: rank 0 writes for host a, rank 4 for host b
    assert plan(peers, source=0, replaced={2}) == {0: [2], 4: [3]}
    assert plan(peers, source=1, replaced={2, 5}) == {0: [2], 4: [3, 5]}


def test_a_receiver_without_a_holder_beside_it_sends_every_rank_to_the_group():
    assert plan([peer("a"), peer("b")], source=0, replaced={1}) is None
    assert plan([peer("a"), peer(None)], source=0, replaced={1}) is None  # not switched on
    assert plan([peer(None), peer("a"), peer("a")], source=0, replaced={1, 2}) is None
    # a holder that is not the source will do, and a drifted one is no holder
    assert plan([peer("a"), peer("b"), peer("b")], source=0, replaced={2}) == {1: [2]}
    assert plan([peer("a"), peer("b", 3.0), peer("b")], source=0, replaced={2}) is None


def test_only_tensors_on_the_gpu_every_receivers_tensor_is_on_are_mapped():
    writer = ("GPU-a", "GPU-a", "", "GPU-a")
    # ranks sharing one GPU map all of them; a host tensor never
    assert mapped_by(writer, [writer, writer]) == (0, 1, 3)
    # a receiver whose tensor 1 is on a GPU of its own, or in host memory, keeps 1 out
    assert mapped_by(writer, [writer, ("GPU-a", "GPU-b", "", "GPU-a")]) == (0, 3)
    assert mapped_by(writer, [("GPU-a", "", "", "GPU-a")]) == (0, 3)
    # a GPU per rank (the usual node): nothing is mapped, the bytes go through the segment
    assert mapped_by(("GPU-a",) * 4, [("GPU-b",) * 4]) == ()
    assert mapped_by(writer, [("GPU-a",)]) == ()  # another count of tensors: none
    assert mapped_by(("", ""), [("", "")]) == ()


def test_the_route_names_how_the_tensors_went():
    segment, both = Written("ok", (), (), 2), Written("ok", (0,), ("h",), 1)
    mapped = Written("ok", (0, 1), ("h", "h"), 0)
    assert handover._route([segment]) == "shared memory"
    assert handover._route([Written("ok")]) == "shared memory"  # only empty tensors
    assert handover._route([mapped]) == "CUDA IPC"
    assert handover._route([both]) == "shared memory and CUDA IPC"
    assert handover._route([segment, mapped]) == "shared memory and CUDA IPC"


def test_mapped_tensors_take_no_room_in_the_segment():
    pytest.importorskip("torch")
    import torch

    tensors = [torch.ones(3), torch.ones(100), torch.ones(1)]
    assert handover._offsets(tensors, set()) == [0, 64, 512]
    assert handover._offsets(tensors, {1}) == [0, 64, 64]


def test_a_route_that_is_none_of_the_three_is_a_one_line_error(monkeypatch):
    monkeypatch.setenv(handover.ROUTE_ENV, "shm")
    with pytest.raises(ValueError) as raised:
        handover.me(1.0, [])
    assert str(raised.value) == (
        "AGENTD_SYNC_ROUTE='shm': must be one of group, shared-memory, cuda-ipc"
    )


def test_a_dead_writers_segment_is_removed_by_the_next_writer(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(handover, "SHM_DIR", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    (tmp_path / f"{handover.PREFIX}{gone.pid}-abc").write_bytes(b"x")
    (tmp_path / f"{handover.PREFIX}{os.getpid()}-live").write_bytes(b"x")  # alive: kept
    made = tmp_path / f"{handover.PREFIX}{os.getpid()}-new"
    held: list[int] = []
    assert handover._write(str(made), [torch.ones(3)], set(), held) == "ok"
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [f"{handover.PREFIX}{os.getpid()}-live", made.name]
    os.close(held.pop())


def test_a_writer_of_another_pid_namespace_keeps_its_segment(tmp_path, monkeypatch):
    """A writer in a container sharing /dev/shm (``--ipc=host``) names its segment by a pid
    of its own namespace: here, no process or another. Its segment went to the next
    writer of this namespace in the milliseconds it lived (that hand-over fell back to
    the process group); it is kept while its writer holds the lock it takes on it."""
    pytest.importorskip("torch")
    import torch

    monkeypatch.setattr(handover, "SHM_DIR", str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    theirs = tmp_path / f"{handover.PREFIX}{gone.pid}-theirs"
    theirs.write_bytes(b"x")
    held: list[int] = []
    with lock_holder(str(theirs)) as writer:  # its writer, in another namespace, lives
        try:
            assert handover._write(str(tmp_path / "mine"), [torch.ones(3)], set(), held) == "ok"
            assert theirs.exists()
            assert tempdirs.held(str(tmp_path / "mine"))  # ours, while we hand it over
        finally:
            for fd in held:
                os.close(fd)
        held.clear()
        writer.kill()
        writer.wait()
    assert handover._write(str(tmp_path / "next"), [torch.ones(3)], set(), held) == "ok"
    os.close(held.pop())
    assert not theirs.exists()  # its writer died (its lock went with it)


def two_ranks(tmp_path: Path, codes: list[int], *args: str, **env: str) -> list[int]:
    """Run ``torch_handover.py``'s two ranks with ``args`` and ``env`` until they exit
    with ``codes``; their pids."""
    script = str(TESTS / "workers" / "torch_handover.py")
    full = {k: v for k, v in os.environ.items() if k != handover.ROUTE_ENV} | env
    init = str(tmp_path / "init")
    argv = [[sys.executable, script, str(r), init, str(tmp_path), *args] for r in (0, 1)]
    procs = [subprocess.Popen(one, env=full) for one in argv]
    try:
        assert [p.wait(timeout=100) for p in procs] == codes
    finally:
        for p in procs:
            p.kill()
            p.wait()
    return [p.pid for p in procs]


@pytest.mark.torch
@pytest.mark.timeout(120)
@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_two_gloo_ranks_hand_tensors_over_by_each_route(tmp_path, device):
    torch = pytest.importorskip("torch")
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    pids = two_ranks(tmp_path, [0, 0], TEST_DEVICE=device)
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    group, both = "process group", "shared memory and CUDA IPC"
    routes = {
        "shared memory": "shared memory" if device == "cpu" else both,
        "no /dev/shm on the writer": group,
        "the group's route on rank 1": group,
        "GPU memory not exported": group,
        "GPU memory not mapped": group,
        "CUDA IPC stand-in": "CUDA IPC",
        "shared memory and a CUDA IPC stand-in": both,
        "CUDA IPC with a tensor in host memory": group,
        "CUDA IPC": group if device == "cpu" else "CUDA IPC",
    }
    for name, route in routes.items():
        assert [r[name]["route"] for r in reports] == [route, route], name
        assert reports[1][name]["equal"], name  # rank 1 now holds rank 0's tensors
        assert reports[1][name]["contiguous"][1] is False  # copied in place, not replaced
    assert not [p for p in Path("/dev/shm").glob(f"{handover.PREFIX}{pids[0]}-*")]


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_a_receiver_that_dies_leaves_no_segment_behind(tmp_path):
    """The writer's peer dies during the hand-over: its sync() fails as the group does,
    and its segment (256 bytes here, a model's size on a real job) is gone all the same."""
    pytest.importorskip("torch")
    two_ranks(tmp_path, [0, 3], "receiver-dies")
    report = json.loads((tmp_path / "0.json").read_text())
    assert report["failure"] and report["left"] == [], report


@pytest.mark.torch
@pytest.mark.timeout(120)
def test_the_state_comes_from_a_rank_that_holds_it_whatever_the_plan_said(tmp_path):
    """A kept rank lost between its node's join and the round's start is replaced by a new
    process that the plan still names as the source: the ranks agree on who holds the
    state (tests/inprocess/test_lost_source.py has the whole job). A kept rank whose node
    sat a round out holds an older round's state: it receives the latest; one whose agent
    calls it stale (it waited as a spare) holds nothing."""
    pytest.importorskip("torch")
    two_ranks(tmp_path, [0, 0], "holders")
    reports = [json.loads((tmp_path / f"{r}.json").read_text()) for r in (0, 1)]
    for report in reports:  # both ranks see the same agreement
        assert report["the planned source holds nothing"] == {
            "synced": True,
            "source": 1,
            "replaced": [0],
            "fresh": False,
            "rank 1's": True,
        }
        assert report["no rank holds anything"] == {
            "synced": False,  # load the checkpoint
            "source": None,
            "replaced": [],
            "fresh": True,
            "rank 1's": report is reports[1],  # nothing was handed over
        }
        assert report["every rank holds it"] == {
            "synced": True,
            "source": None,
            "replaced": [],
            "fresh": False,
            "rank 1's": report is reports[1],
        }
        # its node waited as a spare while the other trained a round (bench_chaos seed 9)
        assert report["rank 0 holds an earlier round's"] == {
            "synced": True,
            "source": 1,
            "replaced": [0],
            "fresh": False,
            "rank 1's": True,
        }
        # its agent says so where the rounds cannot: the spare's round-4 state is older
        # than the job's, whatever the others hold (bench_chaos --place tls seed 23)
        assert report["rank 0's node sat a round out"] == report["rank 0 holds an earlier round's"]
        assert report["only a stale rank holds it"] == {
            "synced": False,  # load the checkpoint, newer than the spare's state
            "source": None,
            "replaced": [],
            "fresh": True,
            "rank 1's": report is reports[1],
        }
