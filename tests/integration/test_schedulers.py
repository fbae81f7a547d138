"""``agentd run --nproc-per-node 1 script`` with no rendezvous option, on every node of a
simulated Slurm job or Kubernetes Indexed Job (issue 40): three agents on 127.0.0.1-3,
each given only the environment its scheduler sets, form one world and survive the loss
of the node that serves the store. Kubernetes' pod names resolve through an /etc/hosts
bound in each agent's own mount namespace, with its own hostname (UTS namespace), as the
kubelet writes them."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from agentd.schedulers.slurm import PORT_BASE, PORT_SPAN
from tests.conftest import SCHEDULED_ENV, TESTS, port_share, wait_until

WORLD = str(TESTS / "workers" / "world_loop.py")
REPO = TESTS.parent
HOSTS = ("127.0.0.1", "127.0.0.2", "127.0.0.3")
WILL = re.compile(r"releases it through the store candidates \S+, \S+, \S+")
STARTED = "Started 1 worker(s), attempt 0"


def worlds(out: Path, size: int) -> list[str]:
    return sorted(p.name for p in out.glob(f"w{size}_*"))


def kill_the_store_host_and_see_two_go_on(agents, out: Path, stop: Path) -> None:
    """SIGKILL ``agents[0]``, which serves the store, once the others stand by to serve it
    and its guardian runs (it starts right after the workers, and carries out the will
    that releases the node: killed before, the others would wait for the last call); the
    other two go on at world 2 and exit 0."""
    host = agents[0]
    wait_until(lambda: WILL.search(host.stderr()), 30, what="the store host's will")
    wait_until(lambda: STARTED in host.stderr(), 30, what="the store host's guardian")
    host.proc.send_signal(signal.SIGKILL)
    wait_until(lambda: len(worlds(out, 2)) == 2, 30, what="the two others at world 2")
    stop.touch()
    for agent in agents[1:]:
        assert agent.wait(60) == 0, agent.stderr()[-3000:]


def free_slurm_job() -> str:
    """A job id whose store port is free on all three addresses, and one of this test
    worker's ports: another worker's test, handed its ports by ``free_port``, once took
    the port that the job id gave, and the job's agents joined that test's store."""
    import random
    import socket

    mine = port_share()
    for job in random.sample(range(100_000, 999_999), 2000):
        port = PORT_BASE + zlib.crc32(f"slurm-{job}.0".encode()) % PORT_SPAN  # step 0
        if port not in mine:
            continue
        try:
            for host in HOSTS:
                with socket.socket() as sock:
                    sock.bind((host, port))
        except OSError:
            continue
        return str(job)
    raise RuntimeError("no free store port")


def slurm_env(job: str, index: int) -> dict[str, str]:
    """What srun sets for the task on node ``index`` of a 3-node job step (nothing else)."""
    return {
        "SLURM_JOB_ID": job,
        "SLURM_STEP_ID": "0",
        "SLURM_NNODES": "3",
        "SLURM_JOB_NODELIST": "127.0.0.[1-3]",
        "SLURM_NODEID": str(index),
        "SLURMD_NODENAME": HOSTS[index],
        "SLURM_PROCID": str(index),
    }


@pytest.mark.parametrize("torch_worker", ["forked"], indirect=True)
def test_a_slurm_job_needs_no_rendezvous_flags_and_outlives_the_store_host(
    run_agentd, tmp_path, torch_worker
):
    """The workers import torch, forked from the zygote as the default does (the meeting
    and the failover are the agents': spawned workers change neither, and cost 10 s of
    CPU more; the Slurm drain below runs both ways, since its signal reaches every
    process)."""
    out, stop = tmp_path / "worlds", tmp_path / "stop"
    out.mkdir()
    job, job_args = free_slurm_job(), (*torch_worker, WORLD, str(out), str(stop))
    agents = [
        run_agentd("--nproc-per-node", "1", *job_args, env=slurm_env(job, index), log_dir=False)
        for index in range(3)
    ]
    wait_until(lambda: len(worlds(out, 3)) == 3, 60, what="one world of 3")
    said = agents[1].stderr()
    assert (
        f"Slurm job {job} step 0: 3 nodes (1:3), endpoint 127.0.0.1:" in said
        and "1 worker per node, this node 127.0.0.2, drain on SIGUSR1" in said
    ), said
    assert "Hosting the rendezvous store on 127.0.0.1:" in agents[0].stderr()
    kill_the_store_host_and_see_two_go_on(agents, out, stop)


def test_the_batch_script_runs_one_world_under_a_simulated_slurm(tmp_path):
    """deploy/slurm/train.sbatch, as sbatch would run it on the first node of a 3-node job:
    its srun (tests/schedulers/fake_srun.py) starts one agent per node with srun's
    variables; the script's token makes the first three hosts the store's candidates."""
    out, stop, logs, bin_dir = (tmp_path / name for name in ("worlds", "stop", "logs", "bin"))
    for folder in (out, logs, bin_dir):
        folder.mkdir()
    srun = bin_dir / "srun"
    srun.write_text(
        f'#!/bin/sh\nexec {sys.executable} {TESTS / "schedulers" / "fake_srun.py"} "$@"\n'
    )
    srun.chmod(0o755)
    job = free_slurm_job()
    env = {k: v for k, v in os.environ.items() if not k.startswith(SCHEDULED_ENV)}
    env.update(
        SLURM_JOB_ID=job,
        SLURM_NNODES="3",
        SLURM_JOB_NODELIST="127.0.0.[1-3]",
        FAKE_SRUN_OUT=str(logs),
        PATH=os.pathsep.join((str(bin_dir), str(Path(sys.executable).parent), env["PATH"])),
    )
    script = REPO / "deploy" / "slurm" / "train.sbatch"
    batch = subprocess.Popen(
        ["bash", str(script), "--nproc-per-node", "1", WORLD, str(out), str(stop)],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_until(lambda: len(worlds(out, 3)) == 3, 60, what="one world of 3")
        stop.touch()
        assert batch.wait(60) == 0
    finally:
        if batch.poll() is None:
            os.killpg(batch.pid, signal.SIGKILL)
            batch.wait()
    said = (logs / "task1.log").read_text()
    assert (
        f"Slurm job {job} step 0: 3 nodes (1:3), endpoint 127.0.0.1:" in said
        and "candidates 127.0.0.1,127.0.0.2,127.0.0.3, 1 worker per node, this node 127.0.0.2,"
        in said
    ), said
    assert "Standing as store candidate 1 of 3 on 127.0.0.2:" in said, said


def pod_prefix(tmp_path: Path, index: int) -> tuple[str, ...]:
    """Run the agent as pod ``index`` of Indexed Job ``job`` under headless Service
    ``train``: its own hostname, and the /etc/hosts the kubelet would write (every pod's
    name resolving to its 127.0.0.N)."""
    hosts = tmp_path / "hosts"
    if not hosts.exists():
        lines = ["127.0.0.1 localhost"]
        lines += [f"{h} job-{i}.{DOMAIN} job-{i}" for i, h in enumerate(HOSTS)]
        hosts.write_text("\n".join(lines) + "\n")
    become = 'hostname "$1" && mount --bind "$2" /etc/hosts && shift 2 && exec "$@"'
    return (
        "unshare",
        "--mount",
        "--uts",
        "--",
        "sh",
        "-c",
        become,
        "sh",
        f"job-{index}",
        str(hosts),
    )


DOMAIN = "train.default.svc.cluster.local"


@pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("unshare") is None,
    reason="needs root for mount and UTS namespaces",
)
def test_a_kubernetes_indexed_job_needs_no_rendezvous_flags(run_agentd, tmp_path):
    out, stop = tmp_path / "worlds", tmp_path / "stop"
    out.mkdir()
    env = {
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "AGENTD_NNODES": "2:3",  # the manifest's; MIN:N goes on without a lost pod
        "AGENTD_STORE_TOKEN": "from-a-secret",
    }
    agents = [
        run_agentd(
            "--nproc-per-node",
            "1",
            WORLD,
            str(out),
            str(stop),
            env={**env, "JOB_COMPLETION_INDEX": str(index)},
            prefix=pod_prefix(tmp_path, index),
            log_dir=False,
        )
        for index in range(3)
    ]
    wait_until(lambda: len(worlds(out, 3)) == 3, 60, what="one world of 3")
    said = agents[1].stderr()
    names = ",".join(f"job-{i}.{DOMAIN}" for i in range(3))
    assert (
        f"Kubernetes Job job: 3 nodes (2:3), endpoint job-0.{DOMAIN}:29400, candidates "
        f"{names}, 1 worker per node, this node job-1.{DOMAIN} (given: --nnodes, --nproc-per-node)"
    ) in said, said
    kill_the_store_host_and_see_two_go_on(agents, out, stop)


def test_slurms_warning_to_every_process_of_a_node_drains_it(run_agentd, tmp_path, torch_worker):
    """``#SBATCH --signal=USR1@120`` reaches every process of a job step on a node, as
    slurmstepd signals them: the agent drains (its default under Slurm) and its worker,
    guardian and any helper ignore the signal meant for the agent (the zygote and a worker
    forked from it too), so every rank checkpoints at one step and the other nodes go on
    from it."""
    import json

    import psutil

    from tests.drain.test_drain import stepping

    def notes(pattern: str) -> list[dict]:
        return [json.loads(p.read_text()) for p in out.glob(pattern) if p.suffix != ".tmp"]

    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    job = free_slurm_job()
    train = (*torch_worker, str(TESTS / "drain" / "train_steps.py"), str(out), str(stop))
    agents = [
        run_agentd("--nproc-per-node", "1", *train, env=slurm_env(job, index), log_dir=False)
        for index in range(3)
    ]
    wait_until(lambda: len(notes("start_0_*")) == 3, 60, what="a job of three nodes")
    leaving = agents[1]
    wait_until(lambda: "Started 1 worker(s), attempt 0" in leaving.stderr(), what="its worker")
    stepping(out, 3)
    step = psutil.Process(leaving.pid)
    for process in [step, *step.children(recursive=True)]:
        process.send_signal(signal.SIGUSR1)
    assert leaving.wait(60) == 128 + signal.SIGUSR1, leaving.stderr()[-3000:]
    checkpoints = notes("ckpt_0_*")
    assert len(checkpoints) == 3, leaving.stderr()[-3000:]
    [at] = {c["step"] for c in checkpoints}  # every rank at one step
    wait_until(lambda: len(notes("start_1_*")) == 2, 30, what="the two others, from that step")
    assert {(s["world"], s["resumed_at"]) for s in notes("start_1_*")} == {(2, at)}
    stop.touch()
    assert [agent.wait(60) for agent in (agents[0], agents[2])] == [0, 0]
