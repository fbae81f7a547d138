"""A Slurm job step's shape, from the variables ``srun`` sets on each node.

One agent per node (``srun --ntasks-per-node=1 agentd run ...``): the nodes are the
step's (``SLURM_STEP_NUM_NODES``, ``SLURM_STEP_NODELIST``), else the job's; the run id is
the job id and step id; the store is served on the first host, on a port derived from the
run id (two jobs sharing a node do not meet on one port), with the first three hosts as
its candidates; each node is ``SLURMD_NODENAME``. The size is elastic, ``1:N``: Slurm
never replaces a node it lost, so the others go on without it (``--nnodes N`` to stop
instead). The workers per node are the GPUs Slurm gave the node, else one. SIGUSR1, the
warning ``#SBATCH --signal=USR1@120`` sends before the time limit, drains the job: every
rank checkpoints at one step (it reaches every process of the step; the workers ignore it,
see :mod:`agentd.support.child_signals`).
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping

from agentd.exceptions import ConfigError
from agentd.schedulers.detected import Detected, Placement, place, standalone, visible_gpus
from agentd.schedulers.hostlist import HostlistError, expand

PORT_BASE, PORT_SPAN = 20000, 10000
"""The store's port is ``PORT_BASE + crc32(run id) % PORT_SPAN``: below Linux's ephemeral
range, and the same on every node of a step."""
TOKEN_HINT = (
    "export AGENTD_STORE_TOKEN=$(openssl rand -hex 16) in the batch script, before srun "
    "(srun passes it to every node; see deploy/slurm/train.sbatch)"
)


def detect_slurm(environ: Mapping[str, str], given: Mapping[str, str]) -> Detected:
    """The options a Slurm job step implies (ConfigError naming the variable when its
    environment is half-set or contradicts itself)."""
    job_var, job_id = _first(environ, "SLURM_JOB_ID", "SLURM_JOBID") or ("SLURM_JOB_ID", "")
    if not job_id:
        raise ConfigError("SLURM_JOB_ID: not set; --scheduler slurm needs a Slurm job")
    step = _first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
    run_id = f"slurm-{job_id}" + (f".{step[1]}" if step else "")
    job = f"Slurm job {job_id}" + (f" step {step[1]}" if step else "")
    nodes_var, nodes = _count(
        environ, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES"
    )
    values = {"rdzv_id": run_id, "drain_on": "SIGUSR1"}
    read_from = {"rdzv_id": job_var + (f", {step[0]}" if step else ""), "drain_on": job_var}
    _nproc(environ, values, read_from)
    one_node = standalone(given) or given.get("nnodes", "").replace(" ", "") in ("1", "1:1")
    if nodes <= 1 or one_node:  # the allocation's hosts are not this job's to read
        return Detected("Slurm", job, values, read_from)
    if step is None and not _placed_by_user(given):
        raise ConfigError(
            f"SLURM_STEP_ID: not set, so agentd runs in the batch script of a {nodes}-node "
            f"allocation ({nodes_var}), on its first node only: start it on every node with "
            "srun --ntasks-per-node=1 agentd run ..."
        )
    _check_tasks(environ, nodes_var, nodes)
    list_var, hosts = _hosts(environ, nodes_var, nodes)
    this_host = environ.get("SLURMD_NODENAME", "")
    if not this_host:
        raise ConfigError(f"SLURMD_NODENAME: not set, and {list_var} names {nodes} hosts")
    if this_host not in hosts:
        raise ConfigError(
            f"SLURMD_NODENAME: {this_host!r} is not among the hosts of {list_var} ({_short(hosts)})"
        )
    node_id = environ.get("SLURM_NODEID")
    if node_id is not None and (not node_id.isdigit() or int(node_id) >= nodes):
        raise ConfigError(f"SLURM_NODEID: {node_id!r} must be within 0..{nodes - 1} ({nodes_var})")
    port = PORT_BASE + zlib.crc32(run_id.encode()) % PORT_SPAN
    placement = Placement(
        hosts, this_host, hosts.index(this_host), nodes, port, f"{list_var}, SLURMD_NODENAME"
    )
    more, more_from = place(placement, given, job, TOKEN_HINT)
    read_from.update(more_from)
    for name in ("nnodes", "rdzv_backend"):
        if name in more_from:
            read_from[name] = nodes_var
    return Detected("Slurm", job, {**values, **more}, read_from)


def _placed_by_user(given: Mapping[str, str]) -> bool:
    """The user said where the job runs (its nodes, or a store of its own)."""
    return any(name in given for name in ("nnodes", "rdzv_endpoint"))


def _first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """The first of ``names`` that is set (and not empty), with its value."""
    for name in names:
        if environ.get(name, "").strip():
            return name, environ[name].strip()
    return None


def _count(environ: Mapping[str, str], *names: str) -> tuple[str, int]:
    found = _first(environ, *names)
    if found is None:
        return names[1], 1
    name, text = found
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{name}: {text!r} must be a positive number of nodes")
    return name, int(text)


def _hosts(environ: Mapping[str, str], nodes_var: str, nodes: int) -> tuple[str, list[str]]:
    names = ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
    found = _first(environ, *names)
    if found is None:
        raise ConfigError(f"SLURM_JOB_NODELIST: not set, and {nodes_var} is {nodes}")
    name, text = found
    try:
        hosts = expand(text)
    except HostlistError as exc:
        raise ConfigError(f"{name}: {exc}") from None
    if len(hosts) != nodes:
        raise ConfigError(f"{name}: {text!r} names {len(hosts)} hosts, but {nodes_var} is {nodes}")
    return name, hosts


def _check_tasks(environ: Mapping[str, str], nodes_var: str, nodes: int) -> None:
    """One agent per node: it starts the node's workers itself."""
    text = environ.get("SLURM_STEP_NUM_TASKS", "")
    if text.isdigit() and int(text) > nodes:
        raise ConfigError(
            f"SLURM_STEP_NUM_TASKS: srun started {text} tasks on {nodes} nodes; agentd runs "
            "once per node and starts the workers itself (srun --ntasks-per-node=1)"
        )


def _nproc(environ: Mapping[str, str], values: dict[str, str], read_from: dict[str, str]) -> None:
    """The workers per node: the GPUs Slurm gave this node, else one."""
    gpus = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    found = (
        ("SLURM_GPUS_ON_NODE", int(gpus))
        if gpus.isdigit() and int(gpus) > 0
        else visible_gpus(environ, "CUDA_VISIBLE_DEVICES")
    )
    if found is not None:
        read_from["nproc_per_node"], count = found
        values["nproc_per_node"] = str(count)


def _short(hosts: list[str]) -> str:
    return ",".join(hosts[:4]) + (",..." if len(hosts) > 4 else "")
