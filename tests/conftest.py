"""Shared helpers: run real agents and workers, wait on conditions, clean up by pid."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest

from agentd.hygiene import orphans

pytest_plugins = ["tests.helpers.socket_leaks"]

TESTS = Path(__file__).parent
WORKER = str(TESTS / "workers" / "worker.py")
TORCH_WORKER = str(TESTS / "workers" / "torch_worker.py")
START_MODES = {"forked": (), "spawned": ("--no-preload",)}
"""The defaults matrix: the flags that start a torch-importing worker each way."""
FORKED_LINE = "workers forked from a zygote preloading torch"
DEADLINE = 20.0
SCHEDULED_ENV = ("AGENTD_", "PET_", "SLURM_", "SLURMD_", "JOB_COMPLETION_INDEX")
"""Variables no agent under test inherits: options, and a scheduler's environment (a suite
run inside a Slurm job or a pod must not read it)."""


def installed(*packages: str) -> None:
    """Skip the test unless these top-level packages are installed, without importing
    them here: the test's agents import them in their workers, and ``importorskip`` cost
    each pytest process that ran such a test the import too (lightning: 4.9 s of CPU)."""
    missing = [p for p in packages if importlib.util.find_spec(p) is None]
    if missing:
        pytest.skip(f"could not find {', '.join(missing)}")


def wait_until(
    predicate: Callable[[], object], timeout: float = DEADLINE, what: str = ""
) -> object:
    """Poll ``predicate`` until it is truthy or ``timeout`` seconds pass (then fail)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")
        time.sleep(0.01)


_handed_out: set[int] = set()
"""The ports :func:`free_port` gave this process: none twice (a test may take several
before its processes bind any)."""


def port_share() -> range:
    """This pytest-xdist worker's ports below the ephemeral range (every Nth one): no other
    worker's test is handed one of them (see :func:`free_port`)."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")[2:]
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    return range(20000, min(low, 32768))[int(worker) if worker.isdigit() else 0 :: workers]


def free_port() -> int:
    """A free port below the ephemeral range: a client retrying an ephemeral port with no
    listener can connect to itself (TCP self-connect) and hold the port a restart needs.

    A port is free until a process binds it, seconds later: so each pytest-xdist worker
    draws from its own share of the range (every Nth port), and this process never draws
    one twice, or two tests could be handed the same port before either binds it. The
    probe binds every address (tests listen on 127.0.0.1-3: a store's candidates take
    the endpoint's port on 127.0.0.2 and .3); it never listens."""
    share = port_share()
    unused = [port for port in share if port not in _handed_out]
    if not unused:  # every port of the share given out: long bound or long freed
        _handed_out.clear()
        unused = list(share)
    for port in random.sample(unused, min(200, len(unused))):
        with socket.socket() as sock:
            try:
                sock.bind(("", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError("no free port below the ephemeral range")


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fp:
            state = fp.read().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in (b"Z", b"X")


def processes_of_agent(agent_pid: int) -> list[int]:
    """Live processes carrying the owner mark of the agent with ``agent_pid``."""
    return [
        pid
        for pid, mark in orphans.marked_processes()
        if mark.startswith(f"{agent_pid}.") and pid_alive(pid)
    ]


def lose_host(agent_pid: int) -> None:
    """The agent's host lost whole: the agent and everything it runs (workers, guardian and
    the guardian's twin) frozen at once, then killed, so nothing of it can act."""
    tree = [agent_pid, *processes_of_agent(agent_pid)]
    with contextlib.suppress(psutil.NoSuchProcess):
        tree += [child.pid for child in psutil.Process(agent_pid).children(recursive=True)]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for pid in dict.fromkeys(tree):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)


def kill_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)


@dataclass
class AgentProc:
    """An ``agentd`` subprocess under test; output goes to files in its directory."""

    proc: subprocess.Popen[bytes]
    out_dir: Path
    log_dir: Path
    stdout_path: Path
    stderr_path: Path
    extra_pids: list[int] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait(self, timeout: float = DEADLINE) -> int:
        return self.proc.wait(timeout)

    def stdout(self) -> str:
        return self.stdout_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def worker_pids(self, rank: int, attempt: int = 0) -> list[int]:
        path = self.out_dir / f"pid_{rank}_{attempt}"
        return [int(p) for p in path.read_text().split()] if path.exists() else []

    def wait_ready(self, ranks: int, attempt: int = 0) -> list[int]:
        """Wait until every rank reported its pids; returns them all."""
        wait_until(
            lambda: all((self.out_dir / f"pid_{r}_{attempt}").exists() for r in range(ranks)),
            what=f"{ranks} worker(s) ready (agent stderr: {self.stderr()[-2000:]})",
        )
        return [pid for r in range(ranks) for pid in self.worker_pids(r, attempt)]


@pytest.fixture(autouse=True)
def private_runtime_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Store tokens (agentd.store.token_file) go to this test's own directory (not in its
    tmp_path), for the test and every agent it starts: nothing is left in /tmp."""
    run = tmp_path_factory.mktemp("xdg-runtime")
    run.chmod(0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    return run


@pytest.fixture(autouse=True)
def private_temp_dir(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """``TMPDIR`` is this test's own directory, for the test and every process it starts:
    what agents make there by default (log folders, timer pipes) goes with pytest's
    temporary directories instead of piling up in /tmp."""
    temp = tmp_path_factory.mktemp("tmp")
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile reads TMPDIR again
    return temp


UNTRUSTED = "dropped (untrusted"
"""What an agent logs when a timer request or heartbeat comes from a pid it does not
trust: from its own workers, in either start mode, never."""


AGENTS_KEY = pytest.StashKey[list["AgentProc"]]()


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--cpu-log",
        metavar="PATH",
        help="append a line per test to PATH: its CPU seconds (the test process and the "
        "children it waited for: agents, their workers), wall seconds, end (Unix time), "
        "xdist worker and id. The suite is CPU-bound on 2 cores: the CPU, not --durations, "
        "says what to make cheaper, and the ends show the workers' idle tail",
    )


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):  # type: ignore[no-untyped-def]
    path = item.config.getoption("--cpu-log")
    if not path:
        return (yield)
    import resource

    def cpu() -> float:
        own, children = (
            resource.getrusage(who) for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
        )
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    began, wall = cpu(), time.time()
    result = yield
    ended = time.time()
    with open(path, "a") as log:  # one short line per write: workers append side by side
        worker = os.environ.get("PYTEST_XDIST_WORKER", "-")
        log.write(f"{cpu() - began:.2f} {ended - wall:.2f} {ended:.2f} {worker} {item.nodeid}\n")
    return result


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    """A failed test shows the last lines each of its agents logged (most failures of a
    real-process test are explained there, and a flaky one may not fail again), and, where
    its workers' output pushed them out of that tail (a progress bar's, say), agentd's own
    lines: the agent's log and what agentd's worker side said."""
    report = yield
    if report.when == "call" and report.failed:
        for agent in item.stash.get(AGENTS_KEY, []):
            with contextlib.suppress(OSError):
                text = agent.stderr()
                report.sections.append((f"agent {agent.pid} stderr (end)", text[-4000:]))
                own = "\n".join(line for line in text.splitlines() if AGENTD_LINE.match(line))
                if own[-4000:] not in text[-4000:]:
                    report.sections.append((f"agent {agent.pid}: agentd's lines", own[-4000:]))
    return report


AGENTD_LINE = re.compile(r"(\d{4}-\d\d-\d\d [\d:,]+ [A-Z]+ )?agentd[.:]")
"""A line of the agent's log, or of agentd's worker side (``agentd.heartbeats.client: ...``)."""


@pytest.fixture
def run_agentd(
    tmp_path: Path, request: pytest.FixtureRequest
) -> Iterator[Callable[..., AgentProc]]:
    """Start ``python -m agentd run ...`` as a real process; everything is killed after.

    After the test, an agent that dropped a request as untrusted fails it, unless the test
    is marked ``foreign_requests`` (it forges them on purpose)."""
    started: list[AgentProc] = []
    request.node.stash[AGENTS_KEY] = started

    def start(
        *args: str,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        log_dir: bool = True,
        command: str = "run",
        preexec: Callable[[], None] | None = None,
        prefix: tuple[str, ...] = (),
        launcher: str = "agentd",
    ) -> AgentProc:
        index = len(started)
        out_dir = tmp_path / f"out{index}"
        out_dir.mkdir()
        logs = tmp_path / f"logs{index}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULED_ENV)}
        full_env["TEST_AGENTD_OUT"] = str(out_dir)
        full_env.update(env or {})
        if launcher == "torchrun":  # the reference, for tests run through both
            argv = [*prefix, sys.executable, "-m", "torch.distributed.run"]
        else:
            argv = [*prefix, sys.executable, "-m", "agentd", command]
        if log_dir and command == "run":
            argv += ["--log-dir", str(logs)]
        stdout_path, stderr_path = out_dir / "agent.stdout", out_dir / "agent.stderr"
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            proc = subprocess.Popen(
                [*argv, *args],
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env=full_env,
                cwd=cwd or tmp_path,
                preexec_fn=preexec,
            )
        agent = AgentProc(proc, out_dir, logs, stdout_path, stderr_path)
        started.append(agent)
        return agent

    yield start

    for agent in started:
        leftovers = processes_of_agent(agent.pid)
        if agent.proc.poll() is None:
            agent.proc.kill()
            agent.proc.wait(DEADLINE)
        kill_pids(leftovers + processes_of_agent(agent.pid) + agent.extra_pids)
    if started:  # an agent killed before its guardian started left its pipe directory
        from agentd.timer.pipe import sweep_stale_pipe_dirs

        sweep_stale_pipe_dirs(tempfile.gettempdir())
    callspec = getattr(request.node, "callspec", None)
    mode = callspec.params.get("torch_worker") if callspec is not None else None
    for agent in started if mode is not None else ():
        forked = FORKED_LINE in agent.stderr()
        assert forked == (mode == "forked"), f"{mode} expected, the agent said otherwise"
    if request.node.get_closest_marker("foreign_requests") is None:
        for agent in started:
            dropped = [line for line in agent.stderr().splitlines() if UNTRUSTED in line]
            assert not dropped, f"agent {agent.pid} dropped its own worker's request: {dropped}"


@pytest.fixture(params=list(START_MODES))
def torch_worker(request: pytest.FixtureRequest) -> tuple[str, ...]:
    """The defaults matrix: a worker that imports torch at module level (worker.py's modes),
    forked from the zygote as the default does, then spawned (``--no-preload``). Put it
    where the script goes: ``run_agentd(*flags, *torch_worker, MODE, ...)``. Every agent of
    the test is checked to have started its workers that way."""
    pytest.importorskip("torch")
    return (*START_MODES[request.param], TORCH_WORKER)


@dataclass
class StoreProc:
    proc: subprocess.Popen[bytes]
    port: int
    err: Path
    host: str = "127.0.0.1"

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"


@pytest.fixture
def run_store(tmp_path: Path) -> Iterator[Callable[..., StoreProc]]:
    """Start ``agentd store`` processes (on a given port to restart one); killed by pid after."""
    started: list[StoreProc] = []

    def start(
        port: int | None = None,
        token: str = "job-secret",
        preexec: Callable[[], None] | None = None,
        host: str = "127.0.0.1",
        peers: str = "",
        args: Sequence[str] = (),
    ) -> StoreProc:
        err = tmp_path / f"store{len(started)}.err"
        port = port or free_port()
        extra = [*(["--peers", peers] if peers else []), *args]
        with open(err, "wb") as fp:
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "agentd",
                    "store",
                    "--host",
                    host,
                    "--port",
                    str(port),
                    *extra,
                ],
                stderr=fp,
                stdout=subprocess.DEVNULL,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "AGENTD_STORE_TOKEN": token},
                preexec_fn=preexec,
            )
        store = StoreProc(proc, port, err, host)
        started.append(store)
        wait_until(lambda: "Store listening on" in err.read_text(), what="the store to listen")
        return store

    yield start
    for store in started:
        if store.proc.poll() is None:
            store.proc.kill()
            store.proc.wait()


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory):
    """One real etcd member for the whole session; tests keep apart by key prefix or run id."""
    from tests.helpers.etcd_server import EtcdCluster, require_etcd

    require_etcd()
    with EtcdCluster(tmp_path_factory.mktemp("etcd")) as cluster:
        yield cluster
