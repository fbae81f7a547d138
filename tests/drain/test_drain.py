"""Drains with real agents: every rank checkpoints at the same step, the job goes on
without the drained node and resumes at that step, and nobody spends a restart."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from agentd.exceptions import DRAINED_UNFINISHED
from tests.conftest import TESTS, WORKER, free_port, wait_until
from tests.helpers.jobs import ALL_AT_ONCE, STEADY, TOKEN, agent_args

TRAIN = str(Path(__file__).with_name("train_steps.py"))


def notes(out: Path, pattern: str) -> list[dict]:
    return [json.loads(p.read_text()) for p in out.glob(pattern) if p.suffix != ".tmp"]


def starts(out: Path, attempt: int) -> list[dict]:
    return notes(out, f"start_{attempt}_*")


def static_nodes(run_agentd, out: Path, stop: Path, nproc: int):
    """Start node ``rank`` of a static job of two nodes of ``nproc`` workers each (``TRAIN``
    into ``out``), with ``flags``."""
    port = str(free_port())

    def start(rank: int, *flags: str):
        return run_agentd(
            *("--nnodes", "2", "--node-rank", str(rank), "--master-port", port),
            *("--nproc-per-node", str(nproc), *flags),
            *(TRAIN, str(out), str(stop)),
        )

    return start


def stepping(out: Path, ranks: int) -> None:
    """Wait until ``ranks`` ranks have each finished a step. A drain asked before any rank
    has stepped finds no step to checkpoint at (none is reported within 0.25 s), and the
    node leaves without a checkpoint: a loaded CI machine signalled that early once,
    with every worker started but none past its first step (2026-12-01)."""

    def stepped() -> bool:
        done = [p.read_text() for p in out.glob("steps_*/*") if p.name.isdigit()]
        return sum(1 for d in done if d.isdigit() and int(d) > 0) >= ranks

    wait_until(stepped, 60, what=f"{ranks} ranks past their first step")


def elastic_job(run_agentd, run_store, tmp_path: Path):
    """An elastic job of 1..3 nodes of one ``TRAIN`` worker each, drained by SIGUSR1:
    ``(start, out, stop)``, where ``start(**env)`` starts a node with ``env`` added."""
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    rdzv = agent_args(store.endpoint, "1:3", conf=ALL_AT_ONCE)
    job = ["--nproc-per-node", "1", "--drain-on", "SIGUSR1", TRAIN, str(out), str(stop)]

    def start(**env: str):
        return run_agentd(*rdzv, *job, env={"AGENTD_STORE_TOKEN": TOKEN, **env})

    return start, out, stop


def running(out: Path, agents: list) -> list:
    """``agents``, once they form one round and each has started its worker."""
    wait_until(lambda: len(starts(out, 0)) == len(agents), 60, what="one job of every node")
    for agent in agents:
        wait_until(lambda a=agent: "Started 1 worker(s), attempt 0" in a.stderr(), what="workers")
    stepping(out, len(agents))
    return agents


def test_a_drain_checkpoints_every_rank_at_one_step_and_the_job_goes_on(
    run_agentd, run_store, tmp_path
):
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = ["--nproc-per-node", "2", TRAIN, str(out), str(stop)]
    # the default last call (30 s): the others must not wait for it once the node is gone
    conf = "keep_alive_interval=0.5,keep_alive_max_attempt=20,join_timeout=60,is_host=0"
    rdzv = agent_args(store.endpoint, "2:3", conf=conf)
    stay = [run_agentd(*rdzv, *job, env=env) for _ in range(2)]
    leaving = run_agentd(
        *rdzv,
        "--drain-on",
        "SIGTERM",
        "--event-log",
        str(tmp_path / "events.jsonl"),
        *job,
        env=env,
    )
    wait_until(lambda: len(starts(out, 0)) == 6, what="a job of three nodes, six ranks")
    # ... and the leaving agent done starting them (a stop signal before that stops at once)
    wait_until(
        lambda: "Started 2 worker(s), attempt 0" in leaving.stderr(),
        what="the leaving agent's workers",
    )
    stepping(out, 6)

    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.wait(60) == 128 + signal.SIGTERM, leaving.stderr()[-3000:]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 6, leaving.stderr()[-3000:]
    assert len({c["step"] for c in ckpts}) == 1, ckpts  # every rank at the same step
    step = ckpts[0]["step"]
    # The others go on at world 4 from that step, without spending a restart.
    wait_until(lambda: len(starts(out, 1)) == 4, 20, what="the job of two nodes, at once")
    assert {s["world"] for s in starts(out, 1)} == {4}
    assert {s["resumed_at"] for s in starts(out, 1)} == {step}
    stop.touch()
    assert [a.wait(30) for a in stay] == [0, 0]
    logs = "".join(a.stderr() for a in stay)
    assert "Drain requested by node" in logs and "restart 1 of" not in logs
    assert f"Drain: every rank checkpoints at step {step}" in leaving.stderr()
    names = [
        json.loads(line)["name"] for line in (tmp_path / "events.jsonl").read_text().splitlines()
    ]
    assert "drain_requested" in names and "drain_done" in names


def test_workers_that_fail_as_a_drained_node_leaves_cost_no_restart(
    run_agentd, run_store, tmp_path
):
    """The drained node's ranks leave, and the others' collectives may fail before its
    leave reaches their agents (seen once in CI: a gloo rank's "Connection reset by peer"
    closed the job with --max-restarts 0). The drained node still answers a roll call,
    so the failure looked like this node's own; it is a membership change."""
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = ["--max-restarts", "0", "--nproc-per-node", "1", TRAIN, str(out), str(stop)]
    rdzv = agent_args(store.endpoint, "2:3", conf=ALL_AT_ONCE)
    failing = {**env, "TEST_AGENTD_FAIL_AFTER_SAVE": "1"}
    stay = [run_agentd(*rdzv, *job, env=failing) for _ in range(2)]
    leaving = run_agentd(*rdzv, "--drain-on", "SIGUSR1", *job, env=env)
    wait_until(lambda: len(starts(out, 0)) == 3, 60, what="a job of three nodes")
    wait_until(lambda: "Started 1 worker(s), attempt 0" in leaving.stderr(), what="the workers")
    stepping(out, 3)
    leaving.proc.send_signal(signal.SIGUSR1)
    assert leaving.wait(60) == 128 + signal.SIGUSR1, leaving.stderr()[-3000:]
    wait_until(lambda: len(starts(out, 1)) == 2, 30, what="the two others, without it")
    stop.touch()
    assert [a.wait(30) for a in stay] == [0, 0], [a.stderr()[-3000:] for a in stay]
    logs = "".join(a.stderr() for a in stay)
    # which an agent hears first, its workers' exit or the drained node's leave, is a race
    # (a store that answers in a millisecond often tells the leave first): either way, the
    # failure is the membership change's and spends no restart
    failed_first = "Our workers failed while node" in logs
    assert failed_first or "Rendezvous round over (generation 0 ended)" in logs, logs
    assert "restart 1 of" not in logs


def test_workers_that_fail_as_a_peer_leaves_cost_no_restart(run_agentd, run_store, tmp_path):
    """S4 for a node SIGTERMed (no drain): its ranks go, the others' collectives fail
    before its leave reaches their agents, and the round ends with no lease lost. The
    member marked gone tells the others it was a membership change, not their failure."""
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN, "TEST_AGENTD_FAIL_ON_PEER_EXIT": "1"}
    job = ["--max-restarts", "0", "--nproc-per-node", "1", TRAIN, str(out), str(stop)]
    rdzv = agent_args(store.endpoint, "2:3", conf=ALL_AT_ONCE)
    agents = [run_agentd(*rdzv, *job, env=env) for _ in range(3)]
    wait_until(lambda: len(starts(out, 0)) == 3, 60, what="a job of three nodes")
    leaving, stay = agents[0], agents[1:]
    wait_until(lambda: "Started 1 worker(s), attempt 0" in leaving.stderr(), what="the workers")
    stepping(out, 3)
    leaving.proc.send_signal(signal.SIGTERM)
    assert leaving.wait(60) == 128 + signal.SIGTERM, leaving.stderr()[-3000:]
    wait_until(lambda: len(starts(out, 1)) == 2, 30, what="the two others, without it")
    stop.touch()
    assert [a.wait(30) for a in stay] == [0, 0], [a.stderr()[-3000:] for a in stay]
    logs = "".join(a.stderr() for a in stay)
    assert "Our workers failed as a member left the round" in logs, logs  # the case at hand
    assert "without spending a restart" in logs and "restart 1 of" not in logs, logs


def test_a_static_jobs_drained_node_checkpoints_every_rank_and_its_replacement_resumes(
    run_agentd, tmp_path
):
    """The default rendezvous (static, node 0's agent serving the store) had no drains: the
    drain signal stopped the node as SIGTERM does, and no rank checkpointed. Now every rank
    of both nodes checkpoints at one step; node 0's agent waits, spending no restart, for
    an agent to take node 1's place; and the one started for it resumes at that step.
    Drained by ``agentd drain``, node 1 exited 0, which tells a scheduler its work is done
    (a Kubernetes Job does not start a pod in its place): it now exits 5, unfinished (a
    drain by signal exits 128+N, as the other static tests' do)."""
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    start_node = static_nodes(run_agentd, out, stop, 2)
    zero, leaving = (
        start_node(0, "--max-restarts", "0"),
        start_node(1, "--max-restarts", "0", "--health-port", "0"),
    )
    url = health_url(leaving)
    wait_until(lambda: len(starts(out, 0)) == 4, 60, what="a job of two nodes, four ranks")
    wait_until(lambda: "Started 2 worker(s), attempt 0" in leaving.stderr(), what="the workers")
    stepping(out, 4)
    done = drain_cli("--url", url)  # the token its agent published for its user
    assert done.returncode == 0, done.stderr
    assert leaving.wait(60) == DRAINED_UNFINISHED, leaving.stderr()[-3000:]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 4, leaving.stderr()[-3000:]
    assert len({c["step"] for c in ckpts}) == 1, ckpts
    step = ckpts[0]["step"]
    assert "(the others wait for it, or for a node in its place)" in leaving.stderr()

    replacement = start_node(1, "--max-restarts", "0")  # its attempt 0 meets node 0's attempt 1

    def again() -> list[dict]:
        return [*starts(out, 1), *notes(out, "start_0_[23]")]

    wait_until(
        lambda: [s["resumed_at"] for s in again()] == [step] * 4,
        30,
        what="all four ranks again, from the drain's step",
    )
    assert {s["world"] for s in again()} == {4}
    stop.touch()
    assert [a.wait(30) for a in (zero, replacement)] == [0, 0], zero.stderr()[-3000:]
    assert "Drain requested by node 1" in zero.stderr()
    assert "without spending a restart" in zero.stderr()


def test_nodes_told_to_drain_at_once_checkpoint_once_and_leave_together(run_agentd, tmp_path):
    """Slurm's time-limit warning reaches every node of a job at once. Each drain replaced
    the other's request: the nodes followed one, and the node whose drain was replaced
    waited out --drain-timeout (60 s) for acknowledgements that never came, then left.
    Now the second request joins the first, and both nodes leave at once."""
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    start_node = static_nodes(run_agentd, out, stop, 2)
    nodes = [start_node(rank, "--drain-on", "SIGUSR1") for rank in (0, 1)]
    wait_until(lambda: len(starts(out, 0)) == 4, 60, what="a job of two nodes, four ranks")
    for node in nodes:
        wait_until(lambda n=node: "Started 2 worker(s), attempt 0" in n.stderr(), what="workers")
    stepping(out, 4)
    for node in nodes:
        node.proc.send_signal(signal.SIGUSR1)
    codes = [node.wait(20) for node in nodes]  # not after the 60 s drain timeout
    assert codes == [128 + signal.SIGUSR1] * 2, [n.stderr()[-3000:] for n in nodes]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 4 and len({c["step"] for c in ckpts}) == 1, ckpts
    logs = "".join(n.stderr() for n in nodes)
    assert "drains already" in logs and "did not confirm" not in logs, logs
    assert not starts(out, 1)  # neither node started workers again


def test_nodes_drained_at_once_whose_workers_report_no_steps_leave_at_the_decision(
    run_agentd, run_store
):
    """Slurm's warning to every node of a job whose script never heartbeats: no step can
    be chosen. The node that joined the other's drain waited 6 s for a step that was
    never published; it now reads the decision (none) and leaves with the other. (A store
    of its own: a node serving it would end the other's wait as it left.)"""
    store = run_store()
    rdzv = agent_args(store.endpoint, "1:2", conf=ALL_AT_ONCE)
    job = ["--nproc-per-node", "1", "--drain-on", "SIGUSR1", WORKER, "sleep"]
    nodes = [run_agentd(*rdzv, *job, env={"AGENTD_STORE_TOKEN": TOKEN}) for _ in range(2)]
    for node in nodes:
        node.wait_ready(1)
    for node in nodes:
        node.proc.send_signal(signal.SIGUSR1)
    assert [n.wait(30) for n in nodes] == [128 + signal.SIGUSR1] * 2
    [joined] = [n.stderr() for n in nodes if "drains already" in n.stderr()]
    seconds = float(re.search(r"no checkpoint in ([\d.]+)s", joined).group(1))
    assert seconds < 6.0, joined[-3000:]  # the joined node's whole drain: not the 6 s wait


def test_two_of_three_elastic_nodes_drained_at_once_leave_the_third_going_on(
    run_agentd, run_store, tmp_path
):
    """The same for the elastic rendezvous: the two drained nodes leave together, and the
    third goes on alone from the step every rank checkpointed at."""
    start, out, stop = elastic_job(run_agentd, run_store, tmp_path)
    agents = running(out, [start() for _ in range(3)])
    leaving, stay = agents[:2], agents[2]
    for agent in leaving:
        agent.proc.send_signal(signal.SIGUSR1)
    codes = [agent.wait(20) for agent in leaving]
    assert codes == [128 + signal.SIGUSR1] * 2, [a.stderr()[-3000:] for a in leaving]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 3 and len({c["step"] for c in ckpts}) == 1, ckpts
    wait_until(lambda: [s["world"] for s in starts(out, 1)] == [1], 30, what="the third alone")
    assert starts(out, 1)[0]["resumed_at"] == ckpts[0]["step"]
    stop.touch()
    assert stay.wait(30) == 0, stay.stderr()[-3000:]


def test_a_drain_whose_node_was_killed_midway_is_followed_by_nobody(
    run_agentd, run_store, tmp_path
):
    """The drained node's agent is SIGKILLed while its ranks save: its request stands, and
    nobody will withdraw it. The others re-form without the node and train on, and so
    does the job with a node that joins later; before, the newcomer read the request as
    it started and followed it: every rank checkpointed again and waited, paused, for
    acknowledgements that never came."""
    start, out, stop = elastic_job(run_agentd, run_store, tmp_path)
    *stay, leaving = running(out, [start(), start(), start(TEST_AGENTD_SAVE_SECONDS="60")])
    leaving.proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: len(notes(out, "ckpt_0_*")) == 3, 30, what="every rank saving")
    [step] = {c["step"] for c in notes(out, "ckpt_0_*")}
    leaving.proc.kill()  # its ranks still save: its drain is never done, nor withdrawn
    wait_until(lambda: len(starts(out, 1)) == 2, 30, what="the two others, without it")
    stay.append(start())  # a node that joins later

    def resumed() -> list[dict]:  # the newcomer's attempt 0, and the others' attempt 2
        return [s for s in notes(out, "start_*") if s["world"] == 3 and s["resumed_at"]]

    def furthest() -> int:
        done = [p.read_text() for p in out.glob("steps_*/*") if p.name.isdigit()]
        return max((int(d) for d in done if d.isdigit()), default=0)

    wait_until(lambda: len(resumed()) == 3, 30, what="the job of three again")
    wait_until(lambda: furthest() >= step + 100, 20, what="the job training on")
    assert {c["step"] for c in notes(out, "ckpt_*")} == {step}, "the dead drain was followed"
    stop.touch()
    assert [a.wait(30) for a in stay] == [0, 0, 0], [a.stderr()[-3000:] for a in stay]


def test_a_drain_that_waits_on_a_slow_node_is_no_hang(run_agentd, tmp_path):
    """The step is chosen once every node told its workers (up to 5 s): meanwhile the
    draining node's ranks wait at their step and the others' in the lockstep. Past the
    learned heartbeat timeout (2 s here) the hang detection killed the paused ranks, and
    the drain failed the job (--max-restarts 0). It holds its judgement while a drain
    pauses the workers; the drain completes at one step, and no node judges a hang."""
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    start_node = static_nodes(run_agentd, out, stop, 1)
    nodes = [start_node(rank, "--drain-on", "SIGUSR1") for rank in (0, 1)]
    for node in nodes:  # a timeout learned (2 s, the floor), and so a hang possible
        wait_until(lambda n=node: "Heartbeat timeout for the step" in n.stderr(), 60)
    leaving, slow = nodes
    slow.proc.send_signal(signal.SIGSTOP)  # an agent slow to tell its workers of the drain
    try:
        leaving.proc.send_signal(signal.SIGUSR1)
        wait_until(lambda: "Drain requested" in leaving.stderr(), what="the drain")
        time.sleep(3.5)  # the fault itself: longer than the 2 s timeout, within the 5 s
    finally:
        slow.proc.send_signal(signal.SIGCONT)
    assert leaving.wait(30) == 128 + signal.SIGUSR1, leaving.stderr()[-3000:]
    assert "Hang:" not in leaving.stderr(), leaving.stderr()[-3000:]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 2 and len({c["step"] for c in ckpts}) == 1, ckpts
    # The frozen node's own check ran late on its thaw, with its rank silent on the paused
    # ones: it counts that silence from the thaw, and reads the drain before judging.
    assert "Hang:" not in slow.stderr(), slow.stderr()[-3000:]
    slow.proc.send_signal(signal.SIGTERM)
    assert slow.wait(30) == 128 + signal.SIGTERM
    assert "Hang:" not in slow.stderr(), slow.stderr()[-3000:]


def drain_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AGENTD_")}
    return subprocess.run(
        [sys.executable, "-m", "agentd", "drain", *args],
        env=full | (env or {}),
        capture_output=True,
        text=True,
        timeout=60,
    )


def health_url(agent) -> str:
    found = wait_until(
        lambda: re.search(r"Health endpoint on (http://\S+)", agent.stderr()),
        what="the health endpoint",
    )
    return found.group(1)


def post_drain(url: str, token: str, body: bytes) -> int:
    request = urllib.request.Request(
        url + "/drain", data=body, method="POST", headers={"Authorization": f"Bearer {token}"}
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


def test_agentd_drain_asks_over_http_with_the_drain_token(run_agentd, run_store, tmp_path):
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    drains = {"AGENTD_DRAIN_TOKEN": "drain-secret"}
    job = ["--nproc-per-node", "1", TRAIN, str(out), str(stop)]
    rdzv = agent_args(store.endpoint, "1:2", conf=ALL_AT_ONCE)
    stay = run_agentd(*rdzv, *job, env=env)
    leaving = run_agentd(*rdzv, "--health-port", "0", *job, env=env | drains)
    url = health_url(leaving)
    wait_until(lambda: len(starts(out, 0)) == 2, what="a job of two nodes")
    stepping(out, 2)  # a drain before their first step has no step to checkpoint at

    refused = drain_cli("--url", url, env={"AGENTD_DRAIN_TOKEN": "wrong"})
    assert refused.returncode == 1 and "needs the bearer token" in refused.stderr
    assert post_drain(url, TOKEN, b"") == 401  # the store's secret is no key to the health port
    assert post_drain(url, "drain-secret", b'{"reason": 7}') == 400
    assert post_drain(url, "drain-secret", b'{"reasn": "typo"}') == 400  # no field of drain
    assert leaving.proc.poll() is None  # nothing was drained by any

    done = drain_cli("--url", url, "--reason", "kernel update", env=drains)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"draining": True, "reason": "kernel update"}
    assert leaving.wait(60) == 0, leaving.stderr()[-3000:]
    assert "This node drained (kernel update" in leaving.stderr()
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 2 and len({c["step"] for c in ckpts}) == 1
    wait_until(lambda: starts(out, 1), what="the other node to go on alone")
    assert starts(out, 1)[0]["resumed_at"] == ckpts[0]["step"]
    stop.touch()
    assert stay.wait(30) == 0


def test_a_local_agent_publishes_its_drain_token_for_its_user(run_agentd, tmp_path):
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    agent = run_agentd("--standalone", "--health-port", "0", TRAIN, str(out), str(stop))
    url = health_url(agent)
    stepping(out, 1)  # a drain before its first step has no step to checkpoint at
    done = drain_cli("--url", url)  # no AGENTD_DRAIN_TOKEN: the published file is read
    assert done.returncode == 0, done.stderr
    # no other node runs the job: it ends unfinished, which is not a success (exit 5)
    assert agent.wait(60) == DRAINED_UNFINISHED, agent.stderr()[-3000:]
    assert agent.stderr().count("no other node runs this job: it ends here, unfinished") == 1
    assert "the others go on without it" not in agent.stderr()
    assert notes(out, "ckpt_0_*"), "the worker checkpointed before the node left"
    port = int(url.rsplit(":", 1)[1])
    from agentd.store import token_file

    assert token_file.read(port, "health") is None  # withdrawn as the agent left


def test_a_drain_of_workers_that_report_no_steps_says_so(run_agentd, torch_worker):
    """Workers that never heartbeat cannot be told a step: no checkpoint is coordinated,
    the log says so, and the node leaves at once (not after the drain timeout)."""
    agent = run_agentd("--standalone", "--health-port", "0", *torch_worker, "sleep")
    url = health_url(agent)
    agent.wait_ready(1)
    done = drain_cli("--url", url)
    assert done.returncode == 0, done.stderr
    assert agent.wait(30) == DRAINED_UNFINISHED, agent.stderr()[-3000:]
    err = agent.stderr()
    assert "the workers report no steps" in err and "this node leaves without one" in err
    assert "no checkpoint in" in err and "checkpoints at step" not in err


def test_a_drain_of_workers_blocked_mid_step_says_they_heartbeat(run_agentd):
    """A rank hung, or blocked in a collective on a hung peer, reports no step either:
    the warning said the workers call neither heartbeat() nor checkpoint_saved() (a
    straggler's drain in chaos seed 131, while a rank of another node was stopped)."""
    job = str(TESTS / "workers" / "heartbeat_job.py")
    hang = ("--hang-rank", "0", "--hang-at", "3")
    agent = run_agentd(
        *("--standalone", "--health-port", "0", "--drain-timeout", "2"),
        *(job, "--steps", "100", "--step", "0.05", *hang),
    )
    url = health_url(agent)

    def blocked() -> bool:
        with urllib.request.urlopen(url + "/status", timeout=10) as answer:
            workers = json.load(answer)["heartbeats"]["workers"]
        return any(w["steps"] >= 1 and w["silent_for"] >= 1.0 for w in workers)

    wait_until(blocked, 60, what="the rank past a step, then silent")
    done = drain_cli("--url", url)
    assert done.returncode == 0, done.stderr
    assert agent.wait(30) == DRAINED_UNFINISHED, agent.stderr()[-3000:]
    err = agent.stderr()
    assert "the workers report no steps" in err, err[-3000:]
    assert "this node's ranks heartbeat, but none reached its next step" in err
    assert "they call neither" not in err


def test_a_drain_waits_for_the_step_of_workers_whose_steps_are_long(
    run_agentd, run_store, tmp_path
):
    """Each rank reports its step at its next heartbeat. A step of a second (a real
    model's is often longer) took longer than the quarter second every node waited for
    the reports, so no node reported one and no checkpoint was made (the CI machine lost
    a drain that way once, with 10 ms steps, under load). A node whose workers heartbeat
    now waits for them as long as its hang detection would."""
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    rdzv = agent_args(store.endpoint, "1:2", conf=ALL_AT_ONCE)  # sealed once both are in
    job = ["--nproc-per-node", "1", "--drain-on", "SIGUSR1", TRAIN, str(out), str(stop)]
    env = {"AGENTD_STORE_TOKEN": TOKEN, "TEST_AGENTD_COMPUTE": "1.0"}
    leaving, staying = running(out, [run_agentd(*rdzv, *job, env=env) for _ in range(2)])
    lockstep = next(out.glob("steps_*"))

    def step() -> int:
        text = (lockstep / "0").read_text()
        return int(text) if text.isdigit() else -1

    before = step()
    wait_until(lambda: step() > before, 30, what="a rank's next step")
    leaving.proc.send_signal(signal.SIGUSR1)  # the ranks heartbeat again in about 1 s
    assert leaving.wait(60) == 128 + signal.SIGUSR1, leaving.stderr()[-3000:]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 2, leaving.stderr()[-3000:]
    assert len({c["step"] for c in ckpts}) == 1, ckpts
    stop.touch()
    assert staying.wait(30) == 0, staying.stderr()[-3000:]
    assert {s["resumed_at"] for s in starts(out, 1)} == {ckpts[0]["step"]}


@pytest.mark.torch
@pytest.mark.timeout(300)  # six gloo ranks import torch at once: its waits allow 120 s each
def test_a_gloo_job_checkpoints_at_one_step_and_loses_none(run_agentd, run_store, tmp_path):
    pytest.importorskip("torch")
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    job = [
        "--nproc-per-node",
        "2",
        str(Path(__file__).with_name("gloo_steps.py")),
        str(out),
        str(stop),
    ]
    rdzv = agent_args(store.endpoint, "2:3", conf=ALL_AT_ONCE)
    stay = [run_agentd(*rdzv, *job, env=env) for _ in range(2)]
    leaving = run_agentd(*rdzv, "--drain-on", "SIGUSR1", *job, env=env)
    wait_until(lambda: len(starts(out, 0)) == 6, 120, what="a gloo job of six ranks")
    wait_until(lambda: "Started 2 worker" in leaving.stderr(), what="the workers")
    leaving.proc.send_signal(signal.SIGUSR1)
    assert leaving.wait(120) == 128 + signal.SIGUSR1, leaving.stderr()[-3000:]
    ckpts = notes(out, "ckpt_0_*")
    assert len(ckpts) == 6 and len({c["step"] for c in ckpts}) == 1, ckpts
    wait_until(lambda: len(starts(out, 1)) == 4, 120, what="the job of four ranks")
    resumed = starts(out, 1)
    assert {s["world"] for s in resumed} == {4}
    assert {s["resumed_at"] for s in resumed} == {ckpts[0]["step"]}  # not a step lost
    stop.touch()
    assert [a.wait(60) for a in stay] == [0, 0], [a.stderr()[-2000:] for a in stay]


def test_the_checkpoint_signal_reaches_every_worker_as_a_drain_starts(run_agentd, tmp_path):
    job = tmp_path / "job.py"
    job.write_text(
        "import os, signal, sys, time\n"
        "import agentd\n"
        "got = os.path.join(sys.argv[1], 'signal_' + os.environ['LOCAL_RANK'])\n"
        "signal.signal(signal.SIGUSR2, lambda *_: open(got, 'w').close())\n"
        "open(os.path.join(sys.argv[1], 'ready_' + os.environ['LOCAL_RANK']), 'w').close()\n"
        "while True:\n"
        "    time.sleep(0.01)\n"
        "    agentd.heartbeat()\n"
        "    if agentd.checkpoint_requested():\n"
        "        agentd.checkpoint_saved()\n"
    )
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--health-port",
        "0",
        "--checkpoint-signal",
        "SIGUSR2",
        str(job),
        str(tmp_path),
    )
    url = health_url(agent)
    # a worker that has not set its handler yet dies of the signal (its default action)
    wait_until(lambda: len(list(tmp_path.glob("ready_*"))) == 2, what="the workers' handlers")
    assert drain_cli("--url", url).returncode == 0
    assert agent.wait(60) == DRAINED_UNFINISHED, agent.stderr()[-3000:]
    assert sorted(p.name for p in tmp_path.glob("signal_*")) == ["signal_0", "signal_1"]


def test_a_drain_of_a_node_whose_workers_succeeded_asks_no_node_to_checkpoint(run_agentd, tmp_path):
    """Node 0's worker succeeded and its agent waits in the exit barrier when it is told to
    drain (a pod deleted at the end of its job): its ranks need no checkpoint and no
    replacement, so node 1's workers, still at work, are not asked for one (they were),
    and node 0 leaves once node 1 is done."""
    stop = tmp_path / "stop"
    script = tmp_path / "one_works_on.py"
    script.write_text(
        "import os, pathlib, time\n"
        "if os.environ['GROUP_RANK'] == '1':\n"
        f"    while not pathlib.Path({str(stop)!r}).exists():\n"
        "        time.sleep(0.05)\n"
    )
    endpoint = f"127.0.0.1:{free_port()}"
    agents = [
        run_agentd(
            *agent_args(endpoint, "2", "--node-rank", str(rank), conf=STEADY),
            *("--drain-on", "SIGUSR1", str(script)),
        )
        for rank in (0, 1)
    ]
    done = wait_until(
        lambda: [a for a in agents if "waiting for those of the other 1" in a.stderr()],
        what="a node in its exit barrier",
    )[0]
    working = agents[1 - agents.index(done)]
    done.proc.send_signal(signal.SIGUSR1)
    wait_until(lambda: "no node is asked to checkpoint" in done.stderr(), what="the drain said")
    stop.touch()
    assert [a.wait(60) for a in agents] == [0, 0], [a.stderr()[-2000:] for a in agents]
    assert "Drain requested" not in working.stderr(), working.stderr()[-2000:]
