"""Every feature on at once, under seeded faults: what breaks when they meet?

    python bench/bench_chaos.py [--seeds 5] [--start 0] [--steps 400] [--seed N] [--inprocess]
                                [--place loopback|tls|etcd|etcd-stalls|namespaces
                                         |etcd-namespaces|etcd-namespaces-stalls]
                                [--disk-full] [--stragglers]

Each seed runs one job of three real agents on this host (``--nnodes 2:3``, ``c10d`` with
two store candidates on 127.0.0.1 and 127.0.0.2, so the store fails over; ``--place tls``
serves it over mutual TLS), with the watchdog (torch's ``FileTimerClient``,
``TORCHELASTIC_ENABLE_FILE_TIMER=1``), hang detection from heartbeats, drains on SIGTERM,
health endpoints, event logs, the job-wide straggler comparison and the default preload,
all at once. The job (bench/chaos_worker.py) trains with gloo,
checkpoints and resumes. While it trains, faults drawn from the seed strike at random
times:

- ``worker_kill``: SIGKILL to one worker (a crash, an OOM kill);
- ``worker_hang``: SIGSTOP to one worker, never continued (a hang: the watchdog or the hang
  detection must reap it);
- ``zygote_stop``: SIGSTOP to one agent's zygote, never continued (it must be replaced);
- ``agent_kill``: SIGKILL to one agent alone (its workers must not outlive it);
- ``host_lost``: SIGKILL to one agent and every process under it (a host gone);
- ``agent_term``: SIGTERM to one agent (a preemption: its node drains and leaves);
- ``agent_freeze``: SIGSTOP to one agent and its processes for 2-6 s, then SIGCONT;
- with ``--place etcd`` (the agents meet through a 3-member etcd cluster on 127.0.0.1),
  ``etcd_member_kill``: SIGKILL to one etcd member, started again on its data 2-6 s later;
- with ``--place etcd-stalls``, ``etcd_member_kill`` and ``etcd_member_stall``: SIGSTOP to
  one etcd member for 2-8 s (a disk that stalls, a paused VM), then SIGCONT;
- with ``--place namespaces`` (root only: each agent in a network namespace of its own,
  on a bridge), ``partition``: one agent's network cut for 2-8 s, then healed;
- with ``--place etcd-namespaces`` (root only: namespaces whose agents meet through the
  etcd cluster, on the bridge's address), both ``partition`` and ``etcd_member_kill``;
  ``etcd-namespaces-stalls``, ``etcd_member_stall`` too;
- with ``--disk-full`` (root only: each agent's log dir a 64 MiB tmpfs of its own, in a
  mount namespace of its own), ``disk_full``: one agent's log dir filled up for 2-6 s,
  then freed;
- with ``--stragglers`` (a fourth agent, which waits as a spare beyond ``--nnodes 2:3``,
  and ``--replace-stragglers`` with a 0.5 s ``--straggler-interval``), ``node_slow``: one
  node's workers compute three times as long (``agentd.section("compute")``) until its
  agent ends (a throttled GPU, a noisy neighbour): it is to be named and swapped for the
  spare, which the agent started again after it takes the place of;

and an agent that ended (killed, or left on SIGTERM) is started again 2-6 s later with the
same command line, as systemd or a pod's restart would. No fault is drawn in the last
third of the run, so the job can end. Then every invariant is checked:

- **done**: the job trained to its last step, its parameters near the truth;
- **exit**: every agent still running exits 0 (143 if it was sent SIGTERM), within 120 s
  of the job's end;
- **orphans**: no process of the run is left once the agents are gone;
- **trust**: no agent dropped its own worker's request as untrusted;
- **progress**: no restart resumes more than 10 steps behind the furthest step trained
  (the job checkpoints every 10 steps; one restarted in process resumes where its kept
  ranks were);
- **internal**: no agent logged an exception of its own (a traceback, an unretrieved
  task exception, an asyncio error; the workers' output goes to files, ``-r 3``);
- **named**: no agent named a node slow that was not (every worker times its compute,
  so the job-wide comparison runs in every run, under every fault), and, with
  ``--stragglers``, no node was swapped out as a straggler that was not slowed;
- **probes**: no agent failed 3 liveness probes in a row, which would have had a
  kubelet restart its container (``GET /livez`` once a second with a 1 s timeout, while
  the agent runs and nothing froze, killed or stopped it: bench/chaos_probes.py; not
  where the agents' endpoints are in network namespaces of their own).

With ``--inprocess`` the job trains in ``agentd.inprocess.run``: the ranks that did not
fail keep their process and hand their state to the new ones.

One line per seed: its faults, the job's restarts and the steps they trained again (a
restart resumes from the last checkpoint, every 10 steps or at a drain's step), the hangs
the agents found (and how many were of ranks resumed in process, the resume timeout's), with
``--inprocess`` how many times an agent told its kept workers they missed a round and its
in-process fallbacks by reason (``park_timeout``: a rank that did not park in time), with
``--stragglers`` the slowed nodes that were named and swapped, the probes sent (those
that failed, and the slowest answer), and the invariants it broke; ``--seed N`` prints
the faults as they strike (and each failed probe) and keeps the run's folder (the
agents' logs) for a look.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psutil
from chaos_networks import PLACES, Loopback
from chaos_probes import Prober
from run_control import kill_marked, marked_env, wait_for

HERE = Path(__file__).resolve().parent
WORKER = HERE / "chaos_worker.py"
MARK = "BENCH_CHAOS_RUN"
KINDS = (
    "worker_kill",
    "worker_hang",
    "zygote_stop",
    "agent_kill",
    "host_lost",
    "agent_term",
    "agent_freeze",
)
AGENT_WIDE = ("agent_kill", "host_lost", "agent_term", "agent_freeze")
"""The faults that end or stop an agent itself: its liveness probes are not counted."""
AGENTS = 3
"""The agents in the job's rounds (``--nnodes 2:3``); ``--stragglers`` adds a spare."""
STRAGGLERS = ("--replace-stragglers", "--straggler-interval", "0.5")
"""The agents' options with ``--stragglers``: a slow node is named within a second or two,
and swapped for the spare."""
SLOWER = 3
"""How many times as long a slowed node's workers compute (bench/chaos_worker.py)."""
NAMED = re.compile(r"Straggler node \S+_(\d+)_[0-9a-f]+:")
"""An agent's naming of a slow node, whose name (host_pid_suffix) holds its agent's pid."""
SWAPPED = re.compile(r"Drain requested by node \S+_(\d+)_[0-9a-f]+ \(straggler:")
"""An agent's log of a straggler's swap (the swapped node's drain, which every agent sees)."""
HANG = re.compile(r"ERROR agentd\.heartbeats\.hang_watch: hang: rank \d+ stopped first \((.*?);")
"""An agent's report of a hang; its group says how the rank was silent (``sent no
heartbeat since it resumed in process``: the resume timeout's, docs/hangs.md)."""
STALE = re.compile(r"WARNING agentd\.inprocess\.service: Kept local rank\(s\) .*? missed a round")
"""An agent's word that its kept workers missed a round sealed without their node (a
spare, late to a round's seal, or back after its lease lapsed): they hold nothing, and
receive the job's state (docs/inprocess.md)."""
FALLBACK = re.compile(r"WARNING agentd\.inprocess\.service: .*\(in-process fallback: (\w+)\)")
"""An agent's word that an in-process restart kept fewer survivors than it could, and why
(``park_timeout``: a rank that did not park in time, replaced by a new process;
docs/inprocess.md)."""
CONF = "keep_alive_interval=0.5,keep_alive_max_attempt=6,last_call_timeout=1,join_timeout=120"
CHECKPOINT_EVERY = 10
"""Steps between two of the job's checkpoints: no restart trains more again."""
INTERNAL = re.compile(
    r"^(Traceback|Task exception was never retrieved|Exception in callback|.* ERROR asyncio)"
)


@dataclasses.dataclass
class Agent:
    """One node: its command line and its current process (None while it is down)."""

    index: int
    argv: list[str]
    env: dict[str, str]
    folder: Path
    proc: subprocess.Popen[bytes] | None = None
    incarnation: int = 0
    pids: dict[int, int] = dataclasses.field(default_factory=dict)  # incarnation -> pid
    slowed: set[int] = dataclasses.field(default_factory=set)  # incarnations ``node_slow`` hit
    termed: bool = False  # this incarnation was sent SIGTERM: it exits 143 (128 + 15)
    back_at: float | None = None  # when to start it again, after it ended
    frozen: list[psutil.Process] = dataclasses.field(default_factory=list)
    struck: int = 0  # bumped at each start, agent-wide fault and thaw (bench/chaos_probes.py)
    thaw_at: float | None = None
    filled: int | None = None  # the pid whose log dir is full (its mount namespace's)
    free_at: float | None = None

    def start(self) -> None:
        self.incarnation += 1
        err, out = self.stderr_path(), self.folder / f"agent{self.incarnation}.stdout"
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            self.proc = subprocess.Popen(
                self.argv, env=self.env, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
            )
        self.pids[self.incarnation] = self.proc.pid
        self.struck += 1
        self.slow_flag().unlink(missing_ok=True)  # a new incarnation: a node as fast as any
        self.back_at = None
        self.termed = False

    def probed(self) -> bool:
        """Whether a liveness probe should find it live: it runs, nothing froze or
        stopped it."""
        return (
            self.proc is not None
            and self.proc.poll() is None
            and not self.frozen
            and not self.termed
        )

    def tree(self) -> list[psutil.Process]:
        if self.proc is None:
            return []
        with contextlib.suppress(psutil.Error):
            return [psutil.Process(self.proc.pid), *psutil.Process(self.proc.pid).children(True)]
        return []

    def workers(self) -> list[psutil.Process]:
        """The agent's workers: processes under it whose command line is the job's (a
        forked worker shows its own, its zygote does not)."""
        return [
            p
            for p in self.tree()[1:]
            if _runs(p, str(WORKER)) and not _runs(p, "agentd.preload.zygote")
        ]

    def zygotes(self) -> list[psutil.Process]:
        return [p for p in self.tree()[1:] if _runs(p, "agentd.preload.zygote")]

    def logs(self) -> list[Path]:
        return sorted(self.folder.glob("agent*.stderr"))

    def stderr_path(self) -> Path:
        """The current incarnation's log."""
        return self.folder / f"agent{self.incarnation}.stderr"

    def logs_dir(self) -> Path:
        """Its ``--log-dir`` (a tmpfs of its own with ``--disk-full``)."""
        return self.folder / "logs"

    def slow_flag(self) -> Path:
        """While this file is there, the node's workers compute ``SLOWER`` times as long
        (bench/chaos_worker.py reads ``CHAOS_SLOW_FLAG``)."""
        return self.folder / "slow"


def _runs(proc: psutil.Process, what: str) -> bool:
    with contextlib.suppress(psutil.Error):
        return what in " ".join(proc.cmdline())
    return False


@dataclasses.dataclass
class Outcome:
    """One seed's run: its faults, the invariants it broke (with detail), its agents,
    and their liveness probes (None where the place's agents cannot be reached)."""

    faults: list[Fault]
    broken: list[str]
    agents: list[Agent]
    probes: Prober | None


@dataclasses.dataclass
class Fault:
    at: float
    kind: str
    target: int

    def __str__(self) -> str:
        return f"{self.kind}@{self.at:.1f}s->{self.target}"


def draw(
    seed: int, horizon: float, kinds: tuple[str, ...] = KINDS, agents: int = AGENTS
) -> list[Fault]:
    """The seed's faults: 2-5 of them, in the first two thirds of ``horizon`` seconds."""
    rng = random.Random(seed)
    faults = [
        Fault(rng.uniform(3.0, horizon * 2 / 3), rng.choice(kinds), rng.randrange(agents))
        for _ in range(rng.randint(2, 5))
    ]
    return sorted(faults, key=lambda f: f.at)


def strike(
    fault: Fault, agents: list[Agent], rng: random.Random, now: float, say, place: Loopback
) -> None:
    if fault.kind in place.kinds:
        place.strike(fault.kind, fault.target, now, rng, lambda line: say(f"{fault}: {line}"))
        return
    agent = agents[fault.target]
    if agent.proc is None or agent.proc.poll() is not None or agent.frozen:
        say(f"{fault}: agent {fault.target} is down or frozen, nothing struck")
        return
    if fault.kind in AGENT_WIDE:
        agent.struck += 1  # first: a probe answered meanwhile is not counted
    if fault.kind in ("worker_kill", "worker_hang"):
        workers = agent.workers()
        if not workers:
            say(f"{fault}: agent {fault.target} runs no worker now, nothing struck")
            return
        victim = rng.choice(workers)
        sig = signal.SIGKILL if fault.kind == "worker_kill" else signal.SIGSTOP
        with contextlib.suppress(psutil.Error):
            victim.send_signal(sig)
        say(f"{fault}: {sig.name} to worker pid {victim.pid}")
    elif fault.kind == "zygote_stop":
        zygotes = agent.zygotes()
        each(zygotes, psutil.Process.suspend)
        say(f"{fault}: SIGSTOP to zygote pid(s) {[p.pid for p in zygotes]}")
    elif fault.kind == "agent_kill":
        agent.proc.kill()
        say(f"{fault}: SIGKILL to agent pid {agent.proc.pid}")
    elif fault.kind == "host_lost":
        tree = agent.tree()
        each(tree, psutil.Process.kill)
        say(f"{fault}: SIGKILL to agent pid {agent.proc.pid} and {len(tree) - 1} under it")
    elif fault.kind == "agent_term":
        agent.proc.send_signal(signal.SIGTERM)
        agent.termed = True
        say(f"{fault}: SIGTERM to agent pid {agent.proc.pid}")
    elif fault.kind == "agent_freeze":
        agent.frozen = agent.tree()
        each(agent.frozen, psutil.Process.suspend)
        agent.thaw_at = now + rng.uniform(2.0, 6.0)
        say(f"{fault}: SIGSTOP to agent pid {agent.proc.pid} and its tree")
    elif fault.kind == "node_slow":
        agent.slow_flag().touch()
        agent.slowed.add(agent.incarnation)
        say(f"{fault}: agent {fault.target}'s workers compute {SLOWER}x as long")
    elif fault.kind == "disk_full" and agent.filled is not None:
        say(f"{fault}: agent {fault.target}'s log dir is full already, nothing struck")
    elif fault.kind == "disk_full":
        fill = ["dd", "if=/dev/zero", f"of={agent.logs_dir() / FILL}", "bs=1M"]
        in_its_mounts(agent.proc.pid, fill)  # until ENOSPC
        agent.filled, agent.free_at = agent.proc.pid, now + rng.uniform(2.0, 6.0)
        say(f"{fault}: agent {fault.target}'s log dir filled up")


def own_disk(logs: Path) -> list[str]:
    """The prefix that gives an agent a 64 MiB tmpfs of its own as ``logs``, in a mount
    namespace of its own (gone with the agent)."""
    mount = 'mkdir -p "$0" && mount -t tmpfs -o size=64m agentd-chaos "$0" && exec "$@"'
    return ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, str(logs)]


FILL = ".chaos-fill"
"""The file that fills an agent's log dir (``disk_full``)."""


def in_its_mounts(pid: int, argv: list[str]) -> None:
    """Run ``argv`` in ``pid``'s mount namespace (where its log dir's tmpfs is)."""
    subprocess.run(["nsenter", "-t", str(pid), "-m", *argv], capture_output=True, timeout=60)


def free(agent: Agent) -> None:
    """Free the log dir ``disk_full`` filled, if its agent still runs (a new one has a
    new tmpfs)."""
    if agent.filled is not None and agent.proc is not None and agent.proc.pid == agent.filled:
        in_its_mounts(agent.filled, ["rm", "-f", str(agent.logs_dir() / FILL)])
    agent.filled, agent.free_at = None, None


def thaw(agent: Agent) -> None:
    agent.struck += 1
    each(agent.frozen, psutil.Process.resume)
    agent.frozen, agent.thaw_at = [], None


def each(procs: list[psutil.Process], act: Callable[[psutil.Process], object]) -> None:
    """``act`` on every process of ``procs`` still there (SIGSTOP, SIGKILL, SIGCONT)."""
    for proc in procs:
        with contextlib.suppress(psutil.Error):
            act(proc)


def run_seed(
    seed: int,
    steps: int,
    root: Path,
    verbose: bool,
    inprocess: bool = False,
    place_name: str = "loopback",
    disk_full: bool = False,
    stragglers: bool = False,
) -> Outcome:
    """Run one seed's job where ``place_name`` says (:mod:`chaos_networks`)."""
    out = root / "out"
    out.mkdir(parents=True)
    place = PLACES[place_name](root, AGENTS + stragglers)
    try:
        return _run_seed(seed, steps, root, verbose, inprocess, place, disk_full, stragglers)
    finally:
        place.close()


def _run_seed(
    seed: int,
    steps: int,
    root: Path,
    verbose: bool,
    inprocess: bool,
    place: Loopback,
    disk_full: bool,
    stragglers: bool,
) -> Outcome:
    out = root / "out"
    env, marker = marked_env(MARK)
    env.update(
        AGENTD_STORE_TOKEN="chaos",
        TORCHELASTIC_ENABLE_FILE_TIMER="1",
        OMP_NUM_THREADS="1",
        CHAOS_INPROCESS="1" if inprocess else "0",
    )
    horizon = steps * 0.06
    kinds = (
        *KINDS,
        *place.kinds,
        *(("disk_full",) if disk_full else ()),
        *(("node_slow",) if stragglers else ()),
    )
    faults = draw(seed, horizon, kinds, AGENTS + stragglers)
    rng = random.Random(seed * 7919 + 1)
    began = time.monotonic()

    def say(line: str) -> None:
        if verbose:
            print(f"  {time.monotonic() - began:6.1f}s {line}", flush=True)

    agents = []
    for index in range(AGENTS + stragglers):
        folder = root / f"node{index}"
        folder.mkdir()
        logs = folder / "logs"
        argv = [
            *place.prefix(index), *(own_disk(logs) if disk_full else []),
            sys.executable, "-m", "agentd", "run", *place.args(index),
            "--rdzv-backend", place.backend, "--rdzv-endpoint", place.endpoints,
            "--rdzv-id", "chaos",
            "--nnodes", f"2:{AGENTS}", "--nproc-per-node", "2",
            "--rdzv-conf", ",".join(filter(None, (CONF, place.conf(index)))),
            "--max-restarts", "100", "--health-port", "0",
            "--event-log", str(folder / "events.jsonl"), "--log-dir", str(logs),
            "--heartbeat-timeout", "8", "--redirects", "3", *(STRAGGLERS if stragglers else ()),
            str(WORKER), str(out), str(steps),
        ]  # fmt: skip
        agent = Agent(index, argv, {**env, **place.env(index)}, folder)
        agent.env.update(CHAOS_SLOW_FLAG=str(agent.slow_flag()), CHAOS_SLOWER=str(SLOWER))
        agents.append(agent)
    broken: list[str] = []
    seen: set[tuple[int, float]] = set()
    probes = Prober(agents, lambda: time.monotonic() - began) if place.probed else None
    try:
        for agent in agents:  # one at a time: the first takes candidate 0, the next 1
            agent.start()
            if agent.index < place.candidates:
                wait_for(lambda a=agent: "store candidate" in _text(a.stderr_path()), 20)
        if probes is not None:
            probes.start()
        if not wait_for((out / "starts.jsonl").exists, 120):
            return Outcome(faults, ["done: the job never started"], agents, probes)
        began = time.monotonic()  # the faults' clock: from the first step on
        pending = list(faults)
        done = out / "done.json"
        deadline = began + horizon * 4 + 120
        ended_at = None
        while time.monotonic() < deadline:
            now = time.monotonic() - began
            for agent in agents:
                for proc in agent.tree():
                    with contextlib.suppress(psutil.Error):
                        seen.add((proc.pid, proc.create_time()))
                if agent.thaw_at is not None and now >= agent.thaw_at:
                    thaw(agent)
                    say(f"SIGCONT to agent {agent.index}")
                if agent.free_at is not None and now >= agent.free_at:
                    free(agent)
                    say(f"agent {agent.index}'s log dir freed")
                if agent.proc is not None and agent.proc.poll() is not None:
                    code = agent.proc.returncode
                    if done.exists():
                        continue
                    say(f"agent {agent.index} exited {code}; started again later")
                    agent.proc, agent.back_at = None, now + rng.uniform(2.0, 6.0)
                back = agent.back_at is not None and now >= agent.back_at
                if agent.proc is None and back and not done.exists():
                    agent.start()
                    say(f"agent {agent.index} started again (pid {agent.proc.pid})")
            while pending and pending[0].at <= now and not done.exists():
                strike(pending.pop(0), agents, rng, now, say, place)
            place.tend(now, say)
            if done.exists() and ended_at is None:
                ended_at = time.monotonic()
                say("the job is done")
                if probes is not None:  # the agents end now
                    probes.stop()
                    broken += probes.broken()
                for agent in agents:
                    if agent.frozen:
                        thaw(agent)
            if ended_at is not None:
                running = [a for a in agents if a.proc is not None and a.proc.poll() is None]
                if not running or time.monotonic() - ended_at > 120:
                    break
            time.sleep(0.1)
        broken += _check(agents, out, steps, done, ended_at)
        for agent in agents:
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
        left = [pid for pid, created in seen if _alive(pid, created)]
        # a guardian of an agent killed here releases it, up to its will's 15 s and more
        if left and wait_for(lambda: not any(_alive(p, c) for p, c in seen), 30):
            left = []
        if left:
            broken.append(f"orphans: {len(left)} process(es) of the run left: {sorted(left)}")
    finally:
        if probes is not None:
            probes.stop()
        for agent in agents:
            thaw(agent)
            if agent.proc is not None and agent.proc.poll() is None:
                agent.proc.kill()
                agent.proc.wait()
        kill_marked(MARK, marker)
    return Outcome(faults, broken, agents, probes)


def _check(agents: list[Agent], out: Path, steps: int, done: Path, ended_at) -> list[str]:
    broken = []
    if ended_at is None:
        broken.append("done: the job never finished")
    else:
        doc = json.loads(done.read_text())
        w = doc["w"]
        if doc["steps"] != steps or abs(w[0] - 2.0) > 0.1 or abs(w[1] + 3.0) > 0.1:
            broken.append(f"done: trained to {doc}")
        for agent in agents:
            if agent.proc is None:
                continue
            code = agent.proc.poll()
            if code != (128 + signal.SIGTERM if agent.termed else 0):
                broken.append(f"exit: agent {agent.index} {'runs on' if code is None else code}")
    starts = _starts(out)
    for number, start in enumerate(starts[1:], 1):
        behind = start.get("reached", 0) - start["step"]
        if behind > CHECKPOINT_EVERY:
            broken.append(
                f"progress: attempt {number} of the job resumed at step {start['step']}, "
                f"{behind} behind the furthest step trained"
            )
    for agent in agents:
        for log in agent.logs():
            text = _text(log)
            if "dropped (untrusted" in text:
                broken.append(f"trust: {log.name} of node {agent.index} dropped a request")
            lines = [line for line in text.splitlines() if INTERNAL.match(line)]
            if lines:
                broken.append(f"internal: node {agent.index} {log.name}: {lines[0]}")
    named, swapped = slow_verdicts(agents)
    for what, nodes in (("named", named), ("swapped", swapped)):
        for node in sorted(nodes - slowed(agents)):
            broken.append(f"named: node {node[0]} {what} slow in its incarnation {node[1]}")
    return broken


Incarnation = tuple[int, int]
"""An agent's index and one of its incarnations."""


def slowed(agents: list[Agent]) -> set[Incarnation]:
    return {(agent.index, number) for agent in agents for number in agent.slowed}


def slow_verdicts(agents: list[Agent]) -> tuple[set[Incarnation], set[Incarnation]]:
    """The incarnations some agent named slow, and those it saw swapped out as stragglers
    (known by the agent pid in a node's name)."""
    by_pid = {pid: (a.index, number) for a in agents for number, pid in a.pids.items()}
    named: set[Incarnation] = set()
    swapped: set[Incarnation] = set()
    for agent in agents:
        for log in agent.logs():
            text = _text(log)
            for found, pattern in ((named, NAMED), (swapped, SWAPPED)):
                found.update(by_pid.get(int(pid), (-1, int(pid))) for pid in pattern.findall(text))
    return named, swapped


def hangs_found(agents: list[Agent]) -> tuple[int, int]:
    """The hangs the agents reported, and how many of them were ranks resumed in process
    that never heartbeated (held to the resume timeout)."""
    found = [m for a in agents for log in a.logs() for m in HANG.findall(_text(log))]
    return len(found), sum(m.endswith("since it resumed in process") for m in found)


def told_stale(agents: list[Agent]) -> int:
    """How many times an agent marked its kept workers stale (:data:`STALE`)."""
    return sum(len(STALE.findall(_text(log))) for a in agents for log in a.logs())


def fallbacks(agents: list[Agent]) -> collections.Counter[str]:
    """The agents' in-process fallbacks by reason (:data:`FALLBACK`)."""
    found = [m for a in agents for log in a.logs() for m in FALLBACK.findall(_text(log))]
    return collections.Counter(found)


def _starts(out: Path) -> list[dict]:
    """The job's attempts as its rank 0 noted them (bench/chaos_worker.py)."""
    text = _text(out / "starts.jsonl")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def _alive(pid: int, created: float) -> bool:
    with contextlib.suppress(psutil.Error):
        proc = psutil.Process(pid)
        return proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE
    return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, help="run one seed, say what struck, keep its logs")
    parser.add_argument(
        "--inprocess",
        action="store_true",
        help="train in agentd.inprocess.run: the ranks that did not fail keep their process",
    )
    parser.add_argument(
        "--disk-full",
        action="store_true",
        help="each agent's log dir a small tmpfs, filled up now and then (root only)",
    )
    parser.add_argument(
        "--stragglers",
        action="store_true",
        help="a spare agent, --replace-stragglers, and nodes slowed now and then",
    )
    parser.add_argument(
        "--place",
        choices=sorted(PLACES),
        default="loopback",
        help="where the agents meet, and its own faults (bench/chaos_networks.py)",
    )
    args = parser.parse_args()
    seeds = [args.seed] if args.seed is not None else range(args.start, args.start + args.seeds)
    failing = 0
    for seed in seeds:
        root = Path(tempfile.mkdtemp(prefix=f"bench-chaos-{seed}-"))
        began = time.monotonic()
        verbose = args.seed is not None
        outcome = run_seed(
            seed,
            args.steps,
            root,
            verbose,
            args.inprocess,
            args.place,
            args.disk_full,
            args.stragglers,
        )
        took = time.monotonic() - began
        broken, agents, probes = outcome.broken, outcome.agents, outcome.probes
        verdict = "ok" if not broken else "BROKE " + "; ".join(broken)
        starts = _starts(root / "out")
        redone = sum(max(0, s.get("reached", 0) - s["step"]) for s in starts)
        named, swapped = slow_verdicts(agents)
        hangs, resumed = hangs_found(agents)
        said = [f"{took:.0f}s", f"{len(starts) - 1} restarts", f"{redone} steps trained again"]
        said.append(f"{hangs} hangs found ({resumed} of ranks resumed in process)")
        if args.inprocess:
            said.append(f"{told_stale(agents)} times kept workers told stale")
            fell = fallbacks(agents)
            why = ", ".join(f"{n} {reason}" for reason, n in sorted(fell.items()))
            said.append(f"{sum(fell.values())} in-process fallbacks" + (f" ({why})" if why else ""))
        if args.stragglers:
            said.append(f"{len(slowed(agents))} slowed, {len(named)} named, {len(swapped)} swapped")
        if probes is not None:
            failed = f", {len(probes.failures)} failed" if probes.failures else ""
            said.append(f"{probes.sent} probes{failed}, the slowest {probes.worst:.2f}s")
        print(f"seed {seed}: {' '.join(map(str, outcome.faults))} ({', '.join(said)}): {verdict}")
        for failure in probes.failures if probes is not None and verbose else ():
            print(f"  a probe of {failure}")
        sys.stdout.flush()
        failing += bool(broken)
        if args.seed is None and not broken:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"  logs in {root}", flush=True)
    print(f"{len(seeds)} seeds, {failing} broke an invariant")
    return 1 if failing else 0


if __name__ == "__main__":
    sys.exit(main())
