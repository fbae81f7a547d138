"""What ``agentd run`` reads from a scheduler's environment, through the config as the
command line resolves it: each value, where it came from, that whatever the user gives
wins, and that a half-set or contradictory environment is one line naming the variable."""

from __future__ import annotations

import signal

import pytest

from agentd.config.build import scheduler_line
from agentd.config.resolve import resolve
from agentd.exceptions import ConfigError
from agentd.schedulers.kubernetes import detect_kubernetes

SLURM = {
    "SLURM_JOB_ID": "1234",
    "SLURM_STEP_ID": "0",
    "SLURM_NNODES": "4",
    "SLURM_JOB_NODELIST": "node[01-04]",
    "SLURM_NODEID": "1",
    "SLURMD_NODENAME": "node02",
    "SLURM_PROCID": "1",
    "AGENTD_STORE_TOKEN": "secret",
}


def run(env, **cli):
    return resolve({"script": "train.py", **cli}, env)


def test_a_slurm_node_reads_the_job_shape():
    config = run({**SLURM, "SLURM_GPUS_ON_NODE": "8"})
    assert config.nnodes == (1, 4)
    assert config.rdzv_backend == "agentd"
    assert config.rdzv_id == "slurm-1234.0"
    assert config.local_addr == "node02"
    assert config.nproc_per_node == "8"
    hosts = config.rdzv_endpoint.split(",")
    assert [h.split(":")[0] for h in hosts] == ["node01", "node02", "node03"]
    assert len({h.split(":")[1] for h in hosts}) == 1  # one port, every node's
    assert config.sources["nnodes"] == "Slurm (SLURM_NNODES)"
    assert config.sources["nproc_per_node"] == "Slurm (SLURM_GPUS_ON_NODE)"
    port = hosts[0].split(":")[1]
    assert scheduler_line(config) == (
        f"Slurm job 1234 step 0: 4 nodes (1:4), endpoint node01:{port}, candidates "
        "node01,node02,node03, 8 workers per node, this node node02, drain on SIGUSR1"
    )
    assert run(SLURM, drain_on="SIGTERM").drain_on == (signal.SIGTERM,)  # given: theirs


def test_a_job_step_is_its_own_run_and_the_step_shape_wins():
    env = {
        **SLURM,
        "SLURM_STEP_ID": "2",
        "SLURM_STEP_NUM_NODES": "2",
        "SLURM_STEP_NODELIST": "node[02-03]",
    }
    config = run(env)
    assert (config.rdzv_id, config.nnodes) == ("slurm-1234.2", (1, 2))
    assert config.rdzv_endpoint.startswith("node02:")
    other = run({**env, "SLURM_JOB_ID": "1235"})
    assert other.rdzv_endpoint != config.rdzv_endpoint  # two jobs on one node: two ports


def test_the_workers_are_the_gpus_slurm_gave_else_one():
    assert run({**SLURM, "CUDA_VISIBLE_DEVICES": "0,1"}).nproc_per_node == "2"
    assert run(SLURM).nproc_per_node == "1"


@pytest.mark.parametrize(
    ("given", "env", "field", "value"),
    [
        ({"nnodes": "4"}, {}, "nnodes", (4, 4)),
        ({}, {"AGENTD_NNODES": "3:4"}, "nnodes", (3, 4)),
        ({}, {"PET_RDZV_ID": "mine"}, "rdzv_id", "mine"),
        ({"rdzv_endpoint": "store:1"}, {}, "rdzv_endpoint", "store:1"),
        ({"nproc_per_node": "2"}, {"SLURM_GPUS_ON_NODE": "8"}, "nproc_per_node", "2"),
        ({"local_addr": "10.0.0.2"}, {}, "local_addr", "10.0.0.2"),
    ],
)
def test_an_option_the_user_gives_wins_over_what_is_read(given, env, field, value):
    config = run({**SLURM, **env}, **given)
    assert getattr(config, field) == value
    assert config.rdzv_id in ("slurm-1234.0", "mine")  # the rest is still read
    assert "given: " in scheduler_line(config)


def test_a_given_endpoint_needs_no_token_for_the_one_it_replaces():
    env = {k: v for k, v in SLURM.items() if k != "AGENTD_STORE_TOKEN"}
    config = run(env, rdzv_endpoint="store.example:29400")
    assert (config.rdzv_endpoint, config.nnodes) == ("store.example:29400", (1, 4))


def test_a_config_file_wins_too(tmp_path):
    path = tmp_path / "agentd.toml"
    path.write_text('nnodes = "2:4"\n')
    config = resolve({"script": "train.py"}, SLURM, str(path))
    assert config.nnodes == (2, 4)
    assert config.rdzv_endpoint.startswith("node01:")


def test_an_explicit_backend_is_followed():
    static = run(SLURM, rdzv_backend="static")
    assert (static.nnodes, static.node_rank, static.master_addr) == ((4, 4), 1, "node01")
    etcd = run(SLURM, rdzv_backend="etcd")
    assert etcd.rdzv_endpoint == "" and etcd.rdzv_id == "slurm-1234.0"
    standalone = run(SLURM, standalone=True)
    assert (standalone.nnodes, standalone.rdzv_backend) == ((1, 1), "static")


def test_scheduler_none_reads_nothing_and_slurm_insists():
    config = run(SLURM, scheduler="none")
    assert (config.nnodes, config.rdzv_id, config.detected) == ((1, 1), "", None)
    with pytest.raises(ConfigError, match=r"^SLURM_JOB_ID: not set"):
        run({}, scheduler="slurm")
    assert run({}).detected is None  # auto, outside any scheduler: as before


def test_the_batch_script_of_several_nodes_without_srun_is_refused():
    """Run on the allocation's first node only, it would wait for the last call and then
    train alone: one line saying to start it with srun (exit 2), unless told where."""
    batch = {k: v for k, v in SLURM.items() if k != "SLURM_STEP_ID"}
    with pytest.raises(ConfigError) as caught:
        run(batch)
    assert str(caught.value) == (
        "SLURM_STEP_ID: not set, so agentd runs in the batch script of a 4-node allocation "
        "(SLURM_NNODES), on its first node only: start it on every node with "
        "srun --ntasks-per-node=1 agentd run ..."
    )
    assert run(batch, nnodes="1").nnodes == (1, 1)  # the user says where: theirs
    single = {**batch, "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "node01"}
    assert run(single).nnodes == (1, 1)  # an allocation of one node needs no srun


def test_standalone_inside_an_allocation_reads_no_hosts():
    """A shell of ``salloc`` (the batch host: no ``SLURMD_NODENAME``, no step) or a
    ``kubectl exec`` into a pod: ``--standalone`` runs one node there, with the job's run
    id and workers. It was refused for the allocation's hosts it does not use."""
    shell = {k: v for k, v in SLURM.items() if k not in ("SLURM_STEP_ID", "SLURMD_NODENAME")}
    config = run(shell, standalone=True)
    assert (config.standalone, config.nnodes, config.rdzv_id) == (True, (1, 1), "slurm-1234")
    assert config.rdzv_endpoint == ""
    config = run(shell, nnodes="1")  # torchrun's default, said
    assert (config.nnodes, config.rdzv_endpoint, config.local_addr) == ((1, 1), "", None)
    found = pod(given={"standalone": "true"})
    assert found.values == {"rdzv_id": "train"}  # no nnodes asked for, no store placed


def test_a_single_node_job_needs_no_store():
    config = run({"SLURM_JOB_ID": "9", "SLURM_NNODES": "1", "SLURM_JOB_NODELIST": "n1"})
    assert (config.nnodes, config.rdzv_backend, config.rdzv_id) == ((1, 1), "static", "slurm-9")


def test_without_a_token_a_loopback_job_grows_its_candidates():
    env = {**SLURM, "SLURM_JOB_NODELIST": "127.0.0.[1-4]", "SLURMD_NODENAME": "127.0.0.2"}
    del env["AGENTD_STORE_TOKEN"]
    config = run(env)
    assert "," not in config.rdzv_endpoint and config.rdzv_endpoint.startswith("127.0.0.1:")
    assert "candidates: members as they stand by" in scheduler_line(config)


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"AGENTD_STORE_TOKEN": None}, "--store-token: Slurm job 1234 step 0 runs on several"),
        ({"SLURM_JOB_NODELIST": "node[01-04"}, "SLURM_JOB_NODELIST: 'node[01-04' leaves"),
        (
            {"SLURM_JOB_NODELIST": "node[01-03]"},
            "SLURM_JOB_NODELIST: 'node[01-03]' names 3 hosts, but SLURM_NNODES is 4",
        ),
        ({"SLURM_JOB_NODELIST": None}, "SLURM_JOB_NODELIST: not set, and SLURM_NNODES is 4"),
        ({"SLURM_NNODES": "four"}, "SLURM_NNODES: 'four' must be a positive number"),
        ({"SLURMD_NODENAME": None}, "SLURMD_NODENAME: not set"),
        ({"SLURMD_NODENAME": "node09"}, "SLURMD_NODENAME: 'node09' is not among the hosts"),
        ({"SLURM_NODEID": "4"}, "SLURM_NODEID: '4' must be within 0..3"),
        ({"SLURM_STEP_NUM_TASKS": "32"}, "SLURM_STEP_NUM_TASKS: srun started 32 tasks on 4 nodes"),
        ({"AGENTD_SCHEDULER": "pbs"}, "AGENTD_SCHEDULER: 'pbs' must be one of auto, slurm"),
    ],
)
def test_a_half_set_environment_names_the_variable(change, error):
    env = {**SLURM, **{k: v for k, v in change.items() if v is not None}}
    for key in [k for k, v in change.items() if v is None]:
        del env[key]
    with pytest.raises(ConfigError) as caught:
        run(env)
    assert str(caught.value).startswith(error), caught.value
    assert "\n" not in str(caught.value)


POD = {"JOB_COMPLETION_INDEX": "1", "KUBERNETES_SERVICE_HOST": "10.96.0.1"}
FULL = "train-1.train-svc.ml.svc.cluster.local"


def pod(env=POD, given=None, hostname="train-1", full=FULL):
    given = {"nnodes": "4", "store_token": "s"} if given is None else given
    return detect_kubernetes(env, given, lambda: hostname, lambda: full)


def test_a_pod_of_an_indexed_job_reads_the_job_shape():
    found = pod()
    domain = "train-svc.ml.svc.cluster.local"
    assert found.values == {
        "rdzv_id": "train",
        "nnodes": "1:4",  # never used: Kubernetes' size is always given
        "rdzv_backend": "agentd",
        "local_addr": FULL,
        "rdzv_endpoint": ",".join(f"train-{i}.{domain}:29400" for i in range(3)),
    }
    assert found.job == "Kubernetes Job train"


def test_a_jobset_pod_is_read_the_same_way():
    found = pod(hostname="run-workers-0-1", full="run-workers-0-1.run.ml.svc.cluster.local")
    assert found.values["rdzv_id"] == "run-workers-0"
    assert found.values["rdzv_endpoint"].startswith("run-workers-0-0.run.ml.svc.cluster.local:")


@pytest.mark.parametrize(
    ("kw", "error"),
    [
        ({"given": {"store_token": "s"}}, "AGENTD_NNODES: not set"),
        ({"given": {"nnodes": "1"}}, "JOB_COMPLETION_INDEX: 1 must be below the job's 1 nodes"),
        (
            {"env": {**POD, "JOB_COMPLETION_INDEX": "x"}},
            "JOB_COMPLETION_INDEX: 'x' must be a number",
        ),
        ({"hostname": "worker"}, "JOB_COMPLETION_INDEX: 1, but this pod's hostname 'worker'"),
        (
            {"full": "train-1"},
            "JOB_COMPLETION_INDEX: this pod's full name is 'train-1', with no subdomain",
        ),
        ({"given": {"nnodes": "4"}}, "--store-token: Kubernetes Job train runs on several hosts"),
    ],
)
def test_a_pod_that_contradicts_itself_names_the_variable(kw, error):
    with pytest.raises(ConfigError) as caught:
        pod(**kw)
    assert str(caught.value).startswith(error), caught.value


def test_auto_reads_a_pod_and_none_does_not():
    """This machine is no Indexed Job's pod: its hostname has no index, which is said."""
    env = {**POD, "AGENTD_NNODES": "4", "AGENTD_STORE_TOKEN": "s"}
    with pytest.raises(ConfigError, match=r"^JOB_COMPLETION_INDEX: 1, but this pod's hostname"):
        run(env)
    config = run(env, scheduler="none")
    assert (config.rdzv_backend, config.detected) == ("static", None)


def test_a_pods_workers_are_its_gpus():
    gpus = {**POD, "NVIDIA_VISIBLE_DEVICES": "GPU-a,GPU-b,GPU-c,GPU-d"}
    assert pod(env=gpus).values["nproc_per_node"] == "4"
    assert "nproc_per_node" not in pod(env={**POD, "NVIDIA_VISIBLE_DEVICES": "all"}).values
    assert pod(env={**gpus, "CUDA_VISIBLE_DEVICES": "0"}).values["nproc_per_node"] == "1"
