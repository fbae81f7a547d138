"""torchrun's command line, as its users write it, through torchrun and through agentd.

Each test runs against both launchers where torch is installed (a behaviour that holds
for agentd and not for torchrun is the wrong one); the ones that hold for agentd only
say why.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from tests.conftest import free_port, wait_until
from tests.helpers.logs_plugin import flat_logs_installed

PRINT_ENV = (
    "import json, os; print('ENV ' + json.dumps({k: os.environ.get(k) for k in "
    "('LOCAL_RANK', 'RANK', 'CUDA_VISIBLE_DEVICES')}), flush=True)"
)


@pytest.fixture(params=["torchrun", "agentd"])
def launcher(request) -> str:
    if request.param == "torchrun":
        pytest.importorskip("torch.distributed.run")
    return request.param


def torchrun_has(option: str) -> bool:
    """Whether the installed torchrun's command line has ``option``."""
    from torch.distributed.run import get_args_parser

    return any(option in action.option_strings for action in get_args_parser()._actions)


def script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


def printing_env(tmp_path, *names: str) -> str:
    """A script whose workers print ``ENV`` and the JSON of these variables."""
    return script(
        tmp_path,
        "env.py",
        "import json, os; print('ENV ' + json.dumps({k: os.environ[k] for k in "
        f"{names!r}}}), flush=True)\n",
    )


def envs_seen(agents) -> list[dict[str, str]]:
    """What the workers of ``agents`` printed with :func:`printing_env`, once all ended 0.
    The JSON is read up to its end: torchrun's ``--tee`` tails the worker's file and can
    print a partial line, so its newline follows a second prefix (CI: ``ENV {...}[default0]:``)."""
    assert [agent.wait(120) for agent in agents] == [0] * len(agents), agents[-1].stderr()[-3000:]
    return [
        json.JSONDecoder().raw_decode(line.split("ENV ", 1)[1])[0]
        for agent in agents
        for line in agent.stdout().splitlines()
        if "ENV " in line
    ]


def test_torchs_prefix_template_variable_and_syntax(run_agentd, launcher, tmp_path):
    hello = script(tmp_path, "hello.py", "print('hello', flush=True)\n")
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--tee",
        "3",
        hello,
        env={"TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE": "[${role_name}-${rank}]:"},
        launcher=launcher,
    )
    assert agent.wait(120) == 0, agent.stderr()[-3000:]
    out = agent.stdout()
    assert "[default-0]:hello" in out.replace(" ", "") and "[default-1]:hello" in out.replace(
        " ", ""
    )


@pytest.mark.parametrize("variable", ["PET_SHUTDOWN_TIMEOUT", "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"])
def test_the_shutdown_timeout_variables_bound_the_stop(run_agentd, launcher, tmp_path, variable):
    if launcher == "torchrun" and not torchrun_has("--shutdown-timeout"):
        pytest.skip("this torchrun has no --shutdown-timeout (2.11: SIGKILL after 30 s)")
    if launcher == "torchrun" and variable == "TORCH_ELASTIC_SHUTDOWN_TIMEOUT":
        pytest.skip("torchrun 2.13's command line reads PET_SHUTDOWN_TIMEOUT only")
    stubborn = script(
        tmp_path,
        "stubborn.py",
        """
        import os, signal, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open(os.path.join(sys.argv[1], "ready_" + os.environ["RANK"]), "w").close()
        time.sleep(600)
    """,
    )
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "1",
        stubborn,
        str(tmp_path),
        env={variable: "2"},
        launcher=launcher,
    )
    wait_until(lambda: (tmp_path / "ready_0").exists(), 60, "worker ready")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(20) != 0  # 2 s to SIGKILL, not the default 30


def test_the_launchers_own_error_file_gets_the_root_cause(run_agentd, launcher, tmp_path):
    pytest.importorskip("torch")
    failing = script(
        tmp_path,
        "failing.py",
        """
        from torch.distributed.elastic.multiprocessing.errors import record

        @record
        def main():
            raise ValueError("the root cause, from the worker")

        main()
    """,
    )
    error_file = tmp_path / "launcher_error.json"
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "1",
        failing,
        env={"TORCHELASTIC_ERROR_FILE": str(error_file)},
        launcher=launcher,
    )
    assert agent.wait(120) != 0
    assert "the root cause, from the worker" in json.dumps(json.loads(error_file.read_text()))


def test_torchrun_flags_that_change_nothing_for_a_script_are_accepted(
    run_agentd, launcher, tmp_path
):
    hello = script(tmp_path, "hello.py", "print('hello', flush=True)\n")
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "1",
        "--start-method",
        "forkserver",
        "--run-path",
        "--event-log-handler",
        "null",
        hello,
        launcher=launcher,
    )
    assert agent.wait(120) == 0, agent.stderr()[-3000:]


def test_virtual_local_rank(run_agentd, launcher, tmp_path):
    env_script = script(tmp_path, "env.py", PRINT_ENV + "\n")
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--virtual-local-rank",
        "--tee",
        "3",
        env_script,
        launcher=launcher,
    )
    assert agent.wait(120) == 0, agent.stderr()[-3000:]
    seen = [
        json.loads(line.split("ENV ", 1)[1])
        for line in agent.stdout().splitlines()
        if "ENV " in line
    ]
    by_rank = {s["RANK"]: s for s in seen}
    assert {r: (s["LOCAL_RANK"], s["CUDA_VISIBLE_DEVICES"]) for r, s in by_rank.items()} == {
        "0": ("0", "0"),
        "1": ("0", "1"),
    }


def test_a_static_job_meets_at_the_rdzv_endpoint(run_agentd, launcher, tmp_path):
    """torchrun's static rendezvous (its default backend) takes ``--rdzv-endpoint`` as the
    master's address, before ``--master-addr``/``--master-port``, and its ``timeout``
    setting. agentd once ignored the endpoint: every node's workers got 127.0.0.1:29500,
    and a job of several hosts hung at its first collective."""
    port = str(free_port())
    env_script = printing_env(tmp_path, "MASTER_ADDR", "MASTER_PORT", "RANK")
    agents = [
        run_agentd(
            *f"--nnodes 2 --node-rank {rank} --rdzv-endpoint 127.0.0.1:{port}".split(),
            *["--rdzv-conf", "timeout=60", "--tee", "3"],
            env_script,
            launcher=launcher,
        )
        for rank in (0, 1)
    ]
    seen = envs_seen(agents)
    assert sorted(s["RANK"] for s in seen) == ["0", "1"]
    assert {(s["MASTER_ADDR"], s["MASTER_PORT"]) for s in seen} == {("127.0.0.1", port)}


STATIC_WORLD = """
    import json, os, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    names = ("RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "TORCHELASTIC_RUN_ID",
             "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT")
    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    total = torch.ones(1)
    dist.all_reduce(total)
    if sys.argv[1:2] == ["crash"]:  # each node's first worker, once (a marker file each)
        first = f"{sys.argv[2]}.{os.environ['GROUP_RANK']}"
        if not os.path.exists(first):
            open(first, "w").close()
            if os.environ["GROUP_RANK"] == "1":
                sys.exit(3)  # node 1's worker dies
            time.sleep(3)  # computing, unless stopped: node 1 has restarted its workers
            dist.all_reduce(total)  # where node 0's worker would learn of it
    dist.barrier()
    seen = {k: os.environ[k] for k in names}
    print("ENV " + json.dumps(dict(seen, SUM=int(total.item()))), flush=True)
    dist.destroy_process_group()
"""


def static_nodes(
    run_agentd,
    launcher: str,
    nprocs: tuple[int, ...],
    *flags: str,
    job: tuple[str, ...],
    port: int | None = None,
):
    """A static job of ``len(nprocs)`` nodes on this host, each node its own agent, each
    running ``job`` (the script and its arguments), meeting at ``port`` (else a free one)."""
    port = port or free_port()
    return [
        run_agentd(
            *f"--nnodes {len(nprocs)} --node-rank {rank} --nproc-per-node {nproc}".split(),
            *f"--master-addr 127.0.0.1 --master-port {port} --tee 3".split(),
            *flags,
            *job,
            launcher=launcher,
        )
        for rank, nproc in enumerate(nprocs)
    ]


def test_static_nodes_with_different_worker_counts_form_one_world(run_agentd, launcher, tmp_path):
    """torchrun's static agents gather every node's worker count in node 0's store (which
    the workers share: ``TORCHELASTIC_USE_AGENT_STORE=True``), so nodes may differ.
    agentd's once assumed every node ran as many workers as its own: node 0 counted a world
    of 2 and node 1 of 4, and the job hung at its first collective."""
    job = script(tmp_path, "world.py", STATIC_WORLD)
    seen = envs_seen(static_nodes(run_agentd, launcher, (1, 2), job=(job,)))
    assert sorted((s["RANK"], s["GROUP_RANK"], s["LOCAL_WORLD_SIZE"]) for s in seen) == [
        ("0", "0", "1"),
        ("1", "1", "2"),
        ("2", "1", "2"),
    ]
    assert {
        (s["WORLD_SIZE"], s["SUM"], s["TORCHELASTIC_RUN_ID"], s["TORCHELASTIC_USE_AGENT_STORE"])
        for s in seen
    } == {("3", 3, "none", "True")}


def test_a_static_job_recovers_from_a_worker_lost_on_one_node(run_agentd, tmp_path):
    """Node 1's worker dies after the first collective, and node 1 restarts its workers
    while node 0's compute. agentd's workers once hosted their own store, a new one each
    attempt in rank 0's worker: node 1's new workers reached the old one as it went down,
    and every restart after that failed the same way. Now node 1's restart ends the round
    on node 0 too, and both meet in node 0's agent's store, cleared for the new workers.

    agentd only: torchrun keeps one store for every attempt, and torch 2.13's workers do
    not tell attempts apart in it, so node 1's new workers can meet the last attempt's
    keys; here torchrun recovered in 2 of 3 runs."""
    job = script(tmp_path, "world.py", STATIC_WORLD)
    agents = static_nodes(
        run_agentd, "agentd", (1, 1), "--max-restarts", "3", job=(job, "crash", str(tmp_path / "m"))
    )
    seen = envs_seen(agents)
    assert sorted((s["RANK"], s["SUM"]) for s in seen) == [("0", 2), ("1", 2)]
    assert [s["TORCHELASTIC_RESTART_COUNT"] for s in seen if s["RANK"] == "1"] == ["1"]
    node0 = agents[0].stderr()
    assert "Rendezvous round over" in node0, node0[-3000:]


UNTIL_NODE_1_IS_BACK = """
    import json, os, signal, sys, time
    from datetime import timedelta
    import torch, torch.distributed as dist
    back = sys.argv[1]  # the test writes it once node 1's new agent is started

    def saving(signum, frame):  # node 1's worker, stopped: it takes a while (a checkpoint)
        ended = "Rendezvous round over (node rank 1's agent left"
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # has node 0 re-formed while we still live?
            if ended in open(sys.argv[2]).read():
                open(f"{back}.ended_first", "w").close()
                break
            time.sleep(0.05)
        sys.exit(0)

    if os.environ["GROUP_RANK"] == "1" and len(sys.argv) > 2:
        signal.signal(signal.SIGTERM, saving)
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    total = torch.ones(1)
    if not os.path.exists(back):
        open(f"{back}.{os.environ['RANK']}.started", "w").close()
        while not os.path.exists(back):  # until node 1 is killed: a collective fails
            dist.all_reduce(torch.ones(1))
            time.sleep(0.05)
    dist.all_reduce(total)
    seen = {k: os.environ[k] for k in ("RANK", "GROUP_RANK", "TORCHELASTIC_RESTART_COUNT")}
    print("ENV " + json.dumps(dict(seen, SUM=int(total.item()))), flush=True)
    dist.destroy_process_group()
"""


@pytest.mark.parametrize(("lost", "how"), [(1, "SIGKILL"), (1, "SIGTERM"), (0, "SIGKILL")], ids=str)
def test_a_static_node_lost_and_started_again_rejoins_its_job(run_agentd, tmp_path, lost, how):
    """A node goes, and is started again with the same flags (systemd, a pod restarted or
    made again): SIGKILLed whole (an out-of-memory kill, a reboot), or its agent stopped
    with SIGTERM (a pod deleted, preempted). The other restarts its workers, and the job
    goes on. agentd's new node 1 was refused after a SIGKILL, 'rank 1 is taken by the
    agent ... (pid <the dead one>)', and its exit closed the job on node 0; after a
    SIGTERM, the leaving agent closed the job itself (and with torchrun's default of no
    restarts, node 0 gave up as its worker failed); node 1 exited 1 when node 0 (the
    job's store) went, and the new node 0 waited for it until its timeout.

    agentd only: torchrun rejoins a new node 1 too, but its restarted workers can meet the
    last attempt's keys in the store it keeps (the dead worker's gloo address, refused);
    it ended 0 in 2 of 4 runs here after a SIGKILL. After node 0's, its node 1 exited 1
    ('Broken pipe')."""
    launcher = "agentd"
    job = script(tmp_path, "until_back.py", UNTIL_NODE_1_IS_BACK)
    back = tmp_path / "back"
    # (a node that leaves on a signal ends the round before its workers stop, so the others
    # re-form without spending a restart: torchrun's default of none is enough)
    restarts = "0" if how == "SIGTERM" else "2"
    flags = ("--max-restarts", restarts, "--rdzv-conf", "timeout=120")
    port = free_port()
    node_0_log = tmp_path / "out0" / "agent.stderr"  # (run_agentd's first agent)
    job_args = (job, str(back), *((str(node_0_log),) if how == "SIGTERM" else ()))
    agents = static_nodes(run_agentd, launcher, (1, 1), *flags, job=job_args, port=port)
    assert agents[0].stderr_path == node_0_log
    wait_until(
        lambda: all(Path(f"{back}.{rank}.started").exists() for rank in (0, 1)),
        what=f"both ranks computing (node 1: {agents[1].stderr()[-2000:]})",
    )
    gone, kept = agents[lost], agents[1 - lost]
    whole = [gone.pid, *(p.pid for p in psutil.Process(gone.pid).children(recursive=True))]
    if how == "SIGKILL":
        for pid in whole:  # the whole node: torchrun's workers outlive their agent
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    else:  # its worker takes a while to stop: node 0 re-forms meanwhile, not after it
        gone.proc.send_signal(signal.SIGTERM)
        wait_until(lambda: Path(f"{back}.ended_first").exists(), 30, what="node 0 re-formed")
    gone.wait(60)
    wait_until(lambda: not any(_running(pid) for pid in whole), what="the node's processes gone")
    back.touch()  # before the new node: every worker from now on computes once
    node = f"--nnodes 2 --node-rank {lost} --nproc-per-node 1 --master-addr 127.0.0.1 --tee 3"
    again = run_agentd(
        *node.split(), "--master-port", str(port), *flags, job, str(back), launcher=launcher
    )
    seen = envs_seen([kept, again])
    assert sorted((s["RANK"], s["SUM"]) for s in seen) == [("0", 2), ("1", 2)]
    assert f"generation=1 group_rank={1 - lost}/2" in kept.stderr()  # restarted there
    if lost == 1:
        why = "its process has exited" if how == "SIGKILL" else "it gave the rank back as it left"
        took = f"Took node rank 1 over from the agent on {os.uname().nodename} (pid {gone.pid})"
        assert f"{took}: {why}" in again.stderr()
    else:
        assert "waiting for it to be started again" in kept.stderr()


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


RANK_0_FIRST = """
    import os, sys, time
    from datetime import timedelta
    import psutil
    import torch.distributed as dist

    def running(pid):
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    dist.init_process_group("gloo", timeout=timedelta(seconds=30))
    dist.barrier()  # both ends of gloo's connections are up: rank 0 may leave now
    store = dist.distributed_c10d._get_default_store()
    if dist.get_rank() == 0:
        store.set("rank_0", str(os.getpid()))
        os._exit(0)  # done first, while rank 1 still has the store to use
    rank_0 = int(store.get("rank_0"))
    deadline = time.monotonic() + 30
    while running(rank_0):
        if time.monotonic() > deadline:
            sys.exit(4)
        time.sleep(0.01)
    store.set("rank_1", "done")  # where the store lived in rank 0's process, it is gone
    print("STORE " + store.get("rank_1").decode(), flush=True)
    dist.destroy_process_group()
"""


def test_a_static_job_of_one_node_keeps_the_store_after_rank_0_is_done(
    run_agentd, launcher, tmp_path
):
    """torchrun's most common command line: its agent serves the workers' store, so
    rank 0 ending first does not take it from the others. agentd's rank 0 worker hosted
    it, and rank 1 failed with 'Connection reset by peer'."""
    agent = run_agentd(
        *f"--nproc-per-node 2 --master-port {free_port()} --max-restarts 0 --tee 3".split(),
        script(tmp_path, "rank_0_first.py", RANK_0_FIRST),
        launcher=launcher,
    )
    assert agent.wait(120) == 0, agent.stderr()[-3000:]
    assert "STORE done" in agent.stdout()


def test_an_elastic_job_without_a_run_id_meets_as_one(run_agentd, launcher, tmp_path):
    """``--rdzv-id`` is optional under torchrun (its default, ``none``, is shared by every
    agent). agentd once made up a random id for each agent: at one store they formed a
    job each, and never met (with ``--nnodes 1:2``, two jobs of one node, silently)."""
    port = str(free_port())
    env_script = printing_env(tmp_path, "RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID")
    agents = [
        run_agentd(
            *f"--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}".split(),
            *["--tee", "3"],
            env_script,
            launcher=launcher,
        )
        for _ in range(2)
    ]
    seen = envs_seen(agents)
    assert sorted(s["RANK"] for s in seen) == ["0", "1"]
    assert {(s["WORLD_SIZE"], s["TORCHELASTIC_RUN_ID"]) for s in seen} == {("2", "none")}


def test_jobs_without_a_run_id_keep_their_logs_apart(run_agentd, launcher, tmp_path):
    """Under the shared default id, each job's files get a folder of their own in the log
    directory (``none_<random>``, torch's layout), so a job run again at the same
    ``--log-dir`` neither overwrites the last one's logs nor reads its state."""
    hello = script(tmp_path, "hello.py", "print('hello', flush=True)\n")
    logs = tmp_path / "logs"
    for _ in range(2):
        port = str(free_port())
        agent = run_agentd(
            *f"--nnodes 1 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}".split(),
            *["--log-dir", str(logs), "--redirects", "3"],
            hello,
            launcher=launcher,
        )
        assert agent.wait(120) == 0, agent.stderr()[-3000:]
    runs = sorted(logs.glob("none_*"))
    assert len(runs) == 2, sorted(logs.iterdir())
    for run in runs:
        assert (run / "attempt_0" / "0" / "stdout.log").read_text() == "hello\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--numa-binding", "node"], "--numa-binding: 'node' NUMA binding is not supported"),
        (["--logs-specs", "mine"], "--logs-specs: 'mine' is not an entry point of"),
    ],
)
def test_torchrun_flags_agentd_cannot_honour_are_one_line_errors(
    run_agentd, tmp_path, args, message
):
    """agentd only: torchrun honours NUMA binding near GPUs (which fails on a CPU-only
    host), and raises a traceback for a log specs plugin that is not installed; agentd
    says so in one line, and starts nothing (README)."""
    hello = script(tmp_path, "hello.py", "print('hello')\n")
    agent = run_agentd("--standalone", *args, hello)
    assert agent.wait(60) == 2
    assert message in agent.stderr() and len(agent.stderr().strip().splitlines()) == 1


def with_plugin(run_agentd, launcher: str, tmp_path, plugin: str, path: str, *flags: str):
    """Two workers of ``path`` on one node, with ``--logs-specs plugin`` installed
    (:func:`~tests.helpers.logs_plugin.flat_logs_installed`) and ``flags``."""
    return run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        *flags,
        "--logs-specs",
        plugin,
        path,
        env={"PYTHONPATH": flat_logs_installed(tmp_path / "site")},
        launcher=launcher,
    )


def test_a_logs_specs_plugin_places_the_workers_logs(run_agentd, launcher, tmp_path):
    """``--logs-specs NAME`` loads the installed entry point ``NAME`` of
    ``torchrun.logs_specs`` (here a distribution on PYTHONPATH), made from the output
    options; its reify places every worker's streams and error file."""
    fail = script(
        tmp_path,
        "fail.py",
        """
        import json, os, sys, time
        # rank 1 fails once rank 0 has printed: the launcher stops rank 0 when rank 1
        # fails, and on a loaded machine it once did so before rank 0's line was out
        printed = os.path.join(os.path.dirname(os.path.abspath(__file__)), "printed-0")
        print("out", os.environ["LOCAL_RANK"], flush=True)
        if os.environ["LOCAL_RANK"] == "0":
            open(printed, "w").close()
        if os.environ["LOCAL_RANK"] == "1":
            deadline = time.monotonic() + 60
            while not os.path.exists(printed) and time.monotonic() < deadline:
                time.sleep(0.01)
            with open(os.environ["TORCHELASTIC_ERROR_FILE"], "w") as f:
                json.dump({"message": "rank 1 gave up"}, f)
            sys.exit(3)
        """,
    )
    agent = with_plugin(run_agentd, launcher, tmp_path, "flat", fail)
    assert agent.wait(120) == 1, agent.stderr()[-3000:]
    [folder] = agent.log_dir.glob("flat-*")
    assert {"out-0.txt", "out-1.txt", "err-0.txt", "err-1.txt", "error-1.json"} <= {
        p.name for p in folder.iterdir()
    }
    assert (folder / "out-0.txt").read_text() == "out 0\n"
    assert "rank 1 gave up" in agent.stderr()  # the failure read from the plugin's file


def test_a_logs_specs_plugin_on_the_default_layout_gets_the_output_options(
    run_agentd, launcher, tmp_path
):
    """A plugin that subclasses the default log specs and calls its ``reify``: it is made
    with --redirects as its own library's ``Std`` (torch's ``reify`` knows no other)."""
    hello = script(tmp_path, "hello.py", "import os; print('hello', os.environ['LOCAL_RANK'])\n")
    agent = with_plugin(run_agentd, launcher, tmp_path, "counted", hello, "--redirects", "0:1,1:3")
    assert agent.wait(120) == 0, agent.stderr()[-3000:]
    assert (agent.log_dir / "reified").read_text() == "1\n"
    for rank in range(2):
        [out] = agent.log_dir.glob(f"*/attempt_0/{rank}/stdout.log")
        assert out.read_text() == f"hello {rank}\n"
    assert not list(agent.log_dir.glob("*/attempt_0/0/stderr.log"))  # 0:1: stdout only
    assert list(agent.log_dir.glob("*/attempt_0/1/stderr.log"))


def test_a_directory_as_the_script_says_so(run_agentd, tmp_path):
    (tmp_path / "pkg").mkdir()
    agent = run_agentd("--standalone", "pkg")
    assert agent.wait(60) == 2
    assert "script: 'pkg' is a directory without a __main__.py" in agent.stderr()


def test_a_directory_with_a_main_runs_as_python_runs_it(run_agentd, launcher, tmp_path):
    """``python app/`` runs ``app/__main__.py``, and so does torchrun: agentd refused any
    directory."""
    (tmp_path / "app").mkdir()
    # one write a line: two ranks' print('main', r) interleaved on the shared stdout in CI
    main = "import os, sys; sys.stdout.write('main ' + os.environ['LOCAL_RANK'] + '\\n')\n"
    script(tmp_path, "app/__main__.py", main)
    agent = run_agentd(
        "--standalone", "--nproc-per-node", "2", str(tmp_path / "app"), launcher=launcher
    )
    assert agent.wait(120) == 0, agent.stderr()[-2000:]
    assert sorted(agent.stdout().split("\n")[:-1]) == ["main 0", "main 1"]


def test_help_is_plain_text_and_names_the_variables():
    import subprocess

    text = subprocess.run(
        [sys.executable, "-m", "agentd", "run", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "``" not in text
    assert "PET_NNODES" in text and "TORCHELASTIC_HEALTH_CHECK_PORT" in text
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" in text


def test_duplicate_filters_copy_matching_lines_to_the_attempts_file(run_agentd, launcher, tmp_path):
    """With --tee, as torchrun needs (agentd copies the lines without --tee too)."""
    chatty = script(
        tmp_path,
        "chatty.py",
        """
        import sys
        for step in range(3):
            print(f"loss {step}", flush=True)
            print(f"acc {step}", flush=True)
        print("warn, loss", file=sys.stderr, flush=True)
    """,
    )
    agent = run_agentd(
        "--standalone",
        "--nproc-per-node",
        "2",
        "--tee",
        "3",
        "--duplicate-stdout-filters",
        "loss",
        "--duplicate-stderr-filters",
        "warn,, loss",
        chatty,
        launcher=launcher,
    )
    assert agent.wait(120) == 0, agent.stderr()[-3000:]
    expected = sorted(f"[default{rank}]:loss {step}" for rank in range(2) for step in range(3))
    [out] = list(agent.log_dir.rglob("filtered_stdout.log"))
    copied = out.read_text()
    # torchrun's tail threads share the file without a lock, so two ranks' lines can land
    # interleaved ("[default1]:loss 0[default0]:loss 0"); agentd writes whole lines.
    assert sorted(re.findall(r"\[default\d\]:loss \d", copied)) == expected
    if launcher == "agentd":
        assert sorted(copied.splitlines()) == expected
    [err] = list(agent.log_dir.rglob("filtered_stderr.log"))
    assert err.read_text().count("warn, loss") == 2


def test_duplicate_filters_work_without_tee_too(run_agentd, tmp_path):
    """agentd only: torchrun's copy reads the tee'd files, so without --tee its file stays
    empty; agentd filters the stream itself."""
    chatty = script(tmp_path, "chatty.py", "print('loss 1'); print('acc 1')\n")
    agent = run_agentd("--standalone", "--duplicate-stdout-filters", "loss", chatty)
    assert agent.wait(120) == 0, agent.stderr()[-3000:]
    assert "loss 1" in agent.stdout()  # the console still gets everything
    [out] = list(agent.log_dir.rglob("filtered_stdout.log"))
    assert out.read_text() == "[default0]:loss 1\n"
