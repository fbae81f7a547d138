#!/usr/bin/env python3
"""``srun`` for the simulated Slurm job of the scheduler tests: one task per node of
``SLURM_JOB_NODELIST`` (addresses of this machine, 127.0.0.N), each with the variables
srun sets on its node, the caller's environment passed on as srun's ``--export=ALL``
does. Options (``--name=value``) are accepted and only ``--ntasks-per-node=1`` is
checked. Exits with the highest task exit status, as srun does."""

import os
import subprocess
import sys

from agentd.schedulers.hostlist import expand

args = sys.argv[1:]
options = []
while args and args[0].startswith("--"):
    options.append(args.pop(0))
if "--ntasks-per-node=1" not in options:
    sys.exit("fake srun: the batch script must start one task per node")
hosts = expand(os.environ["SLURM_JOB_NODELIST"])
tasks = []
for index, host in enumerate(hosts):
    env = dict(os.environ)
    env.update(
        SLURM_STEP_ID="0",
        SLURM_STEP_NUM_NODES=str(len(hosts)),
        SLURM_STEP_NODELIST=os.environ["SLURM_JOB_NODELIST"],
        SLURM_STEP_NUM_TASKS=str(len(hosts)),
        SLURM_NODEID=str(index),
        SLURM_PROCID=str(index),
        SLURM_LOCALID="0",
        SLURMD_NODENAME=host,
    )
    with open(os.path.join(os.environ["FAKE_SRUN_OUT"], f"task{index}.log"), "wb") as out:
        tasks.append(subprocess.Popen(args, env=env, stdout=out, stderr=subprocess.STDOUT))
sys.exit(max(task.wait() for task in tasks))
