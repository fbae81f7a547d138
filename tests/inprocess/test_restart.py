"""In-process restarts end to end, with real agents, processes and sockets (no torch)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import (
    FORKED_LINE,
    START_MODES,
    TESTS,
    TORCH_WORKER,
    AgentProc,
    free_port,
    wait_until,
)
from tests.helpers.jobs import TOKEN, agent_args

JOB = str(TESTS / "workers" / "inprocess_job.py")
HAS_TORCH = importlib.util.find_spec("torch") is not None


def start_job(
    tmp_path: Path,
    mode: str,
    *flags: str,
    script: tuple[str, ...] = (JOB,),
    hold: Path | None = None,
) -> subprocess.Popen[str]:
    (tmp_path / "out").mkdir()
    if hold is not None:
        hold.write_text("")
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        *flags,
        *script,
        str(tmp_path / "out"),
        mode,
    ]
    with open(tmp_path / "agent.err", "w") as err:  # the agent writes to it while it runs
        return subprocess.Popen(argv, stderr=err, text=True, cwd=tmp_path)


def calls_of(tmp_path: Path) -> dict[int, list[dict]]:
    out = tmp_path / "out"
    return {
        rank: [json.loads(line) for line in (out / f"rank{rank}.jsonl").read_text().splitlines()]
        for rank in range(3)
    }


def agent_err(tmp_path: Path) -> str:
    return (tmp_path / "agent.err").read_text()


def finish(proc: subprocess.Popen[str], tmp_path: Path) -> tuple[int, str]:
    try:
        proc.wait(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    return proc.returncode, agent_err(tmp_path)


def run_job(
    tmp_path: Path, mode: str, *flags: str
) -> tuple[subprocess.CompletedProcess[str], dict[int, list[dict]]]:
    code, err = finish(start_job(tmp_path, mode, *flags), tmp_path)
    return subprocess.CompletedProcess([], code, "", err), calls_of(tmp_path)


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as response:
        return response.read().decode()


def attempt_of(url: str) -> tuple[int, str]:
    """The attempt and state the agent shows (the attempt counts from its start on)."""
    try:
        doc = json.loads(fetch(url))
    except OSError:  # not serving yet
        return -1, ""
    return doc["attempt"], doc["state"]


@pytest.mark.parametrize(
    ("mode", "flags"),
    [
        ("loop", START_MODES["spawned"]),
        ("hang", ("--file-timer",)),
        ("loop", START_MODES["forked"]),
    ],
    ids=["crash-spawned", "timer-reaped", "crash-forked"],
)
def test_survivors_keep_their_process_and_learn_the_new_attempt(tmp_path, mode, flags):
    """The defaults matrix: the crash variants run a worker that imports torch, spawned
    and forked from the zygote as the default does."""
    port = free_port()
    script = (TORCH_WORKER, JOB) if "hang" != mode and HAS_TORCH else (JOB,)
    proc = start_job(tmp_path, mode, "--health-port", str(port), *flags, script=script)
    try:
        status = f"http://127.0.0.1:{port}/status"
        wait_until(lambda: attempt_of(status) == (1, "HEALTHY"), 60, "attempt 1 running")
        doc = json.loads(fetch(status))
        assert doc["restarts_by_kind"] == {"in_process": 1, "process": 0}
        assert doc["state"] == "HEALTHY" and len(doc["workers"]) == 3
        metrics = fetch(f"http://127.0.0.1:{port}/metrics")
        assert 'agentd_restarts_by_kind_total{kind="in_process"} 1.0' in metrics
    finally:
        (tmp_path / "out" / "release").write_text("")
        code, err = finish(proc, tmp_path)
    done, calls = subprocess.CompletedProcess([], code, "", err), calls_of(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    for rank in (0, 2):  # interrupted in Python, parked, called again in the same process
        first, second = calls[rank]
        assert second["pid"] == first["pid"]
        assert (first["attempt"], second["attempt"]) == ("0", "1")
        assert (first["count"], second["count"]) == (0, 1)
        assert second["replaced"] == [1] and second["source"] == 0 and not second["fresh"]
    first, second = calls[1]  # the dead rank: a new process, told where its state is
    assert second["pid"] != first["pid"]
    assert second["count"] == 0 and second["replaced"] == [1] and second["source"] == 0
    assert "Started 3 worker(s), attempt 1" in done.stderr
    if script != (JOB,):  # started the way the matrix says
        assert (FORKED_LINE in done.stderr) == (flags == START_MODES["forked"])


def test_a_survivor_that_cannot_park_in_time_is_replaced_and_the_others_kept(tmp_path):
    """Rank 0 sleeps in native code through the park; rank 2 parks. Rank 0 is stopped and
    replaced with the rank that died, as a survivor on its way out is; rank 2 keeps its
    process and hands the state over. Before, every rank restarted as a new process. The
    warning says where rank 0 was stuck (it heartbeated once: its stacks can be dumped)."""
    done, calls = run_job(tmp_path, "stuck-one", "--inprocess-park-timeout", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [ln for ln in done.stderr.splitlines() if "in-process fallback" in ln]
    assert re.search(
        r"Local rank\(s\) \[0\] did not park within 1\.0s \(local rank 0 at train "
        r"\(\S+/inprocess_job\.py:\d+\)\): replacing them with new processes; "
        r"local rank\(s\) \[2\] keep theirs \(in-process fallback: park_timeout\)",
        line,
    ), line
    first, second = calls[2]
    assert second["pid"] == first["pid"] and second["count"] == 1, calls
    assert second["replaced"] == [0, 1] and second["source"] == 2 and not second["fresh"]
    for rank in (0, 1):
        first, second = calls[rank]
        assert second["pid"] != first["pid"] and second["count"] == 0
        assert second["replaced"] == [0, 1] and second["source"] == 2


def test_a_rank_found_hung_while_the_others_park_is_killed_and_replaced_alone(tmp_path):
    """Rank 1 dies as rank 0 goes silent in native code; rank 2 parks. The hang detection
    finds rank 0 only during the park, some 3 s later: the agent kills it then, and the
    park ends with rank 2 kept. Before, a hang found during a park was not acted on (a
    parked rank is silent too, and could have been named): the park waited out its
    timeout (20 s here). A rank that parks now tells the hang detection so."""
    done, calls = run_job(
        tmp_path, "hang-in-stop", "--heartbeat-timeout", "3", "--inprocess-park-timeout", "20"
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "hang: rank 0 stopped first" in done.stderr, done.stderr[-3000:]
    killed = "Killing the hung local rank(s) [0] (SIGKILL) while the others park"
    assert killed in done.stderr, done.stderr[-3000:]
    assert "park_timeout" not in done.stderr, done.stderr[-3000:]
    first, second = calls[2]
    assert second["pid"] == first["pid"] and second["count"] == 1, calls
    assert second["replaced"] == [0, 1] and second["source"] == 2
    for rank in (0, 1):
        assert calls[rank][1]["pid"] != calls[rank][0]["pid"], calls


def test_a_kept_rank_found_hung_later_is_killed_first_too(tmp_path):
    """Rank 0 keeps its process through a first restart, then hangs in native code. The
    agent kills it before the others park, as any hung rank. Before, the kill spared it:
    it had parked in the first restart, and a rank that parked is never killed (the agent
    read the last park's answer); it got SIGTERM after the park with the others. A hung
    rank stopped, or holding its peers in a collective, then held the park until its
    timeout (the chaos bench's seed 5: a resumed rank stopped by SIGSTOP)."""
    done, calls = run_job(
        tmp_path,
        "hang-resumed",
        *("--max-restarts", "2", "--heartbeat-timeout", "3", "--inprocess-park-timeout", "20"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    killed = "Killing the hung local rank(s) [0] (SIGKILL) before the others stop"
    assert killed in done.stderr, done.stderr[-3000:]
    assert "park_timeout" not in done.stderr, done.stderr[-3000:]
    assert len({call["pid"] for call in calls[0]}) == 2  # kept once, then a new process
    assert len({call["pid"] for call in calls[2]}) == 1  # kept both times


def test_garbage_on_the_channel_is_named_and_the_restart_uses_new_processes(tmp_path):
    done, calls = run_job(tmp_path, "garbage")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "In-process channel: not JSON: b'not json'" in done.stderr
    assert "Local rank(s) [0, 2] broke the in-process protocol" in done.stderr
    assert "(in-process fallback: broken_channel)" in done.stderr
    for rank in range(3):
        assert calls[rank][1]["pid"] != calls[rank][0]["pid"]


def test_a_rank_whose_exit_lags_its_sockets_is_replaced_and_the_others_kept(tmp_path):
    """A process that held a CUDA context closes its sockets at once but takes up to a
    second to exit (the driver tears the context down): its peers' collectives fail, and
    they raise, before its exit is seen. It used to count as a survivor whose channel
    broke, and every rank restarted as a new process with no word in the log."""
    port = free_port()
    proc = start_job(tmp_path, "slow-exit", "--health-port", str(port))
    try:
        status = f"http://127.0.0.1:{port}/status"
        wait_until(lambda: attempt_of(status) == (1, "HEALTHY"), 60, "attempt 1 running")
        doc = json.loads(fetch(status))
        assert doc["restarts_by_kind"] == {"in_process": 1, "process": 0}
        assert not any(doc["inprocess"]["fallbacks"].values()), doc["inprocess"]
    finally:
        (tmp_path / "out" / "release").write_text("")
        code, err = finish(proc, tmp_path)
    assert code == 0, err[-3000:]
    calls = calls_of(tmp_path)
    for rank in (0, 2):
        first, second = calls[rank]
        assert second["pid"] == first["pid"] and second["count"] == 1 and not second["fresh"]
    assert calls[1][1]["pid"] != calls[1][0]["pid"] and calls[1][1]["replaced"] == [1]
    [result] = (tmp_path / "logs").glob("*/result.json")
    root = json.loads(result.read_text())["root_cause"]
    assert root["local_rank"] == 1 and root["exitcode"] == 3, root  # the exit, not the raise


def test_every_fallback_names_its_reason_in_the_log_status_and_metrics(tmp_path):
    port = free_port()
    hold = tmp_path / "out" / "hold"  # attempt 1 runs until the status is read
    proc = start_job(
        tmp_path, "stuck", "--inprocess-park-timeout", "1", "--health-port", str(port), hold=hold
    )
    try:
        status = f"http://127.0.0.1:{port}/status"
        wait_until(lambda: attempt_of(status) == (1, "HEALTHY"), 60, "attempt 1 running")
        doc = json.loads(fetch(status))["inprocess"]
        assert doc["fallbacks"]["park_timeout"] == 1
        assert doc["last_fallback"] == {"reason": "park_timeout", "local_ranks": [0, 2], "kept": []}
        metrics = fetch(f"http://127.0.0.1:{port}/metrics")
        assert 'agentd_inprocess_fallbacks_total{reason="park_timeout"} 1.0' in metrics
        assert 'agentd_inprocess_fallbacks_total{reason="quick_repeats"} 0.0' in metrics
    finally:
        hold.unlink()
        code, err = finish(proc, tmp_path)
    assert code == 0, err[-3000:]
    [line] = [ln for ln in err.splitlines() if "in-process fallback" in ln]
    assert "WARNING" in line and "Local rank(s) [0, 2] did not park within 1.0s" in line
    assert "restarting every worker as a new process" in line, line  # no survivor parked
    for first, second in calls_of(tmp_path).values():
        assert second["pid"] != first["pid"] and second["replaced"] == []
        assert second["fresh"]  # no rank holds the job's state: the script must load it


def test_without_agentd_run_is_a_plain_call(tmp_path):
    code = (
        "import agentd.inprocess as ip; print(ip.run(lambda a, b=0: a + b, 2, b=3), ip.current())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert out.stdout.strip() == (
        "5 Restart(count=0, replaced=(), source=None, fresh=True, teardown_s=0.0, round=0)"
    )


def test_a_lost_node_is_replaced_by_a_spare_and_the_other_node_keeps_its_workers(
    run_agentd, run_store, tmp_path
):
    store = run_store()
    shared = tmp_path / "shared"
    shared.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    agents = [
        run_agentd(
            *agent_args(store.endpoint, "2", "--nproc-per-node", "2"),
            JOB,
            str(shared),
            "nodes",
            env=env,
        )
        for _ in range(3)
    ]

    def reports(agent: AgentProc) -> dict[int, list[dict]]:
        """Each rank's calls so far: the whole lines of its file (a file may exist, or a
        line be half-written, while we read)."""
        files = {rank: agent.out_dir / f"rank{rank}.jsonl" for rank in (0, 1)}
        found = {}
        for rank, path in files.items():
            if path.exists():
                whole = path.read_text().rpartition("\n")[0]
                calls = [json.loads(line) for line in whole.splitlines()]
                if calls:
                    found[rank] = calls
        return found

    wait_until(lambda: sorted(len(reports(a)) for a in agents) == [0, 2, 2], 60, "a round of 2")
    victim, kept = [a for a in agents if reports(a)]
    spare = next(a for a in agents if not reports(a))
    # (started last, it may not have joined yet: without it, the kept node cannot go on)
    wait_until(lambda: "is full; waiting for the next" in spare.stderr(), 60, "the spare")
    os.kill(victim.pid, signal.SIGKILL)
    victim.proc.wait()
    wait_until(
        lambda: (
            len(reports(spare)) == 2 and all(len(calls) == 2 for calls in reports(kept).values())
        ),
        60,
        "the spare and a resume",
    )
    try:
        new = [calls[0] for calls in reports(spare).values()]
        resumed = [calls for calls in reports(kept).values()]
        kept_ranks = sorted(calls[1]["rank"] for calls in resumed)
        new_ranks = sorted(line["rank"] for line in new)
        assert sorted(kept_ranks + new_ranks) == [0, 1, 2, 3]
        for first, second in resumed:  # the same process, told who is new and who hands over
            assert second["pid"] == first["pid"] and second["count"] == 1
            assert second["replaced"] == new_ranks and second["source"] == min(kept_ranks)
        for line in new:
            assert line["count"] == 0
            assert line["replaced"] == new_ranks and line["source"] == min(kept_ranks)
    finally:
        (shared / "release").write_text("")
    assert [kept.wait(60), spare.wait(60)] == [0, 0], [
        kept.stderr()[-2000:],
        spare.stderr()[-2000:],
    ]
    assert "Rendezvous round over" in kept.stderr()


def test_a_rank_whose_training_function_raises_is_a_failure_but_keeps_its_process(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "release").write_text("")  # attempt 1 returns at once
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        JOB,
        str(tmp_path / "out"),
        "raise",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Restarting worker group (restart 1 of 1)" in done.stderr  # a restart is spent
    calls = calls_of(tmp_path)
    for rank in range(3):  # every process kept, the raising one too; nobody is new
        first, second = calls[rank]
        assert second["pid"] == first["pid"] and second["count"] == 1
        assert second["replaced"] == [] and second["source"] is None


def test_with_no_restart_left_the_raise_fails_the_job_and_is_the_root_cause(tmp_path):
    """A group that is never restarted (--max-restarts 0 on one node) gets no channel:
    ``inprocess.run`` is a plain call that writes what it raised to the error file."""
    (tmp_path / "out").mkdir()
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "3",
        "--log-dir",
        str(tmp_path / "logs"),
        JOB,
        str(tmp_path / "out"),
        "raise",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]
    [result] = (tmp_path / "logs").glob("*/result.json")
    root = json.loads(result.read_text())["root_cause"]
    assert root["rank"] == 1 and root["message"] == "ValueError: loss is NaN at step 7"
    assert [call["channel"] for rank in range(3) for call in calls_of(tmp_path)[rank]] == [
        False
    ] * 3


@pytest.mark.parametrize("flags", [(), ("--master-port", "pinned")], ids=["default", "pinned"])
def test_a_static_job_of_one_node_keeps_its_survivors(tmp_path, flags):
    """torchrun's most common command line (the static backend, one node): the agent
    serves a new workers' store each attempt, pinned port or not, so the survivors are
    kept (they were not while rank 0's worker hosted a store that outlived attempts)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "release").write_text("")  # attempt 1 returns at once
    pinned = [str(free_port()) if flag == "pinned" else flag for flag in flags]
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        *pinned,
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "1",
        "--log-dir",
        str(tmp_path / "logs"),
        JOB,
        str(tmp_path / "out"),
        "loop",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "in-process fallback" not in done.stderr
    calls = calls_of(tmp_path)
    for rank in (0, 2):
        first, second = calls[rank]
        assert second["pid"] == first["pid"] and second["count"] == 1
    first, second = calls[1]  # the dead rank: a new process
    assert second["pid"] != first["pid"] and second["replaced"] == [1]


def test_quick_repeated_in_process_restarts_fall_back_to_new_processes(tmp_path):
    (tmp_path / "out").mkdir()
    argv = [
        sys.executable,
        "-m",
        "agentd",
        "run",
        "--standalone",
        "--nproc-per-node",
        "3",
        "--max-restarts",
        "6",
        "--log-dir",
        str(tmp_path / "logs"),
        JOB,
        str(tmp_path / "out"),
        "raise-always",
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 1, done.stderr[-3000:]  # the restarts ran out
    assert "3 in-process restarts within 60s of each other" in done.stderr
    pids = [[line["pid"] for line in calls] for calls in calls_of(tmp_path).values()]
    for rank_pids in pids:  # attempts 0-3 in one process, 4-6 in a new one
        assert len(rank_pids) == 7
        assert len(set(rank_pids[:4])) == 1 and len(set(rank_pids[4:])) == 1
        assert rank_pids[0] != rank_pids[4]


@pytest.mark.parametrize("how", ["killed", "exiting"])
def test_a_kept_worker_lost_before_the_next_attempt_is_started_anew(tmp_path, how):
    """The backoff holds the restart between the park and the next attempt: a survivor
    killed there, or one that starts to exit there (its channel closes at once, its exit
    comes later, as with a CUDA context, so it cannot be resumed), must not leave its
    rank empty, which would leave the others waiting for it forever."""
    proc = start_job(tmp_path, "loop", "--restart-backoff", "2:2:1:0")
    try:
        wait_until(
            lambda: "Waiting 2.00s before restarting" in agent_err(tmp_path), 60, "the backoff"
        )
        victim = calls_of(tmp_path)[2][0]["pid"]  # parked by now: it waits for its resume
        os.kill(victim, signal.SIGKILL if how == "killed" else signal.SIGUSR1)
        wait_until(
            lambda: all(len(c) == 2 for c in calls_of(tmp_path).values()),
            60,
            "attempt 1 on every rank",
        )
        calls = calls_of(tmp_path)
        assert calls[2][1]["pid"] != victim and calls[2][1]["count"] == 0  # a new process
        assert calls[2][1]["replaced"] == [1, 2]
        assert calls[0][1]["pid"] == calls[0][0]["pid"]  # still kept
    finally:
        (tmp_path / "out" / "release").write_text("")
        code, stderr = finish(proc, tmp_path)
    assert code == 0, stderr[-3000:]
    if how == "exiting":
        assert "Kept local rank(s) [2] closed their in-process channel" in stderr


def test_a_function_entrypoint_is_told_that_it_restarts_as_a_new_process(tmp_path, capfd):
    from agentd import LocalElasticAgent, WorkerSpec
    from tests.workers.functions import in_process

    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=in_process, args=(5,))
    result = LocalElasticAgent(spec, log_dir=tmp_path).run()
    assert result.return_values == {0: 0, 1: 5}  # a plain call
    said = capfd.readouterr().err  # the workers write to the agent's stderr
    assert said.count("function entrypoints restart as new processes, not in process") == 2


def test_a_survivor_whose_group_cannot_be_destroyed_says_so_and_is_replaced(tmp_path):
    done, calls = run_job(tmp_path, "undestroyable")
    assert done.returncode == 0, done.stderr[-3000:]
    assert calls[0][1]["pid"] == calls[0][0]["pid"]  # kept
    assert calls[2][1]["pid"] != calls[2][0]["pid"] and calls[2][1]["count"] == 0  # replaced
    assert calls[2][1]["replaced"] == [1, 2]
    said = done.stderr  # the workers' output goes to the agent's stderr
    assert "the process group could not be destroyed; this rank restarts as a new process" in said
    assert "RuntimeError: the group is wedged" in said
    assert "Local rank(s) [2] exited while the others parked" in said
