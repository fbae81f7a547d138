from __future__ import annotations

import signal

import pytest

from agentd.agent.rendezvous_steps import assign_worker_ranks
from agentd.exceptions import ConfigError, IllegalTransition
from agentd.group import RunResult, WorkerFailure, WorkerGroup, WorkerState, check_transition
from agentd.rendezvous.api import RoleInstanceInfo
from agentd.spec import Std, WorkerSpec, check_name, std_for


def spec(**kw) -> WorkerSpec:
    return WorkerSpec(**{"role": "trainer", "local_world_size": 2, "entrypoint": "python", **kw})


def test_is_running():
    assert WorkerState.is_running(WorkerState.HEALTHY)
    assert WorkerState.is_running(WorkerState.UNHEALTHY)
    for state in ("INIT", "STOPPED", "SUCCEEDED", "FAILED", "UNKNOWN"):
        assert not WorkerState.is_running(WorkerState(state))


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ("INIT", "HEALTHY"),
        ("HEALTHY", "SUCCEEDED"),
        ("HEALTHY", "FAILED"),
        ("FAILED", "STOPPED"),
        ("STOPPED", "INIT"),
        ("HEALTHY", "UNHEALTHY"),
        ("UNHEALTHY", "STOPPED"),
    ],
)
def test_legal_transitions(old, new):
    check_transition(WorkerState(old), WorkerState(new))


@pytest.mark.parametrize(
    ("old", "new"),
    [("SUCCEEDED", "HEALTHY"), ("INIT", "SUCCEEDED"), ("UNKNOWN", "INIT"), ("STOPPED", "HEALTHY")],
)
def test_illegal_transitions(old, new):
    with pytest.raises(IllegalTransition, match=f"from {old} to {new}"):
        check_transition(WorkerState(old), WorkerState(new))


def test_std_parse():
    assert Std.parse("3") is Std.ALL
    assert Std.parse("0:1,2:3") == {0: Std.OUT, 2: Std.ALL}
    assert std_for({0: Std.OUT}, 1) is Std.NONE
    assert std_for(Std.ERR, 5) is Std.ERR
    with pytest.raises(ConfigError, match="redirects: '4'"):
        Std.parse("4")


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"local_world_size": 0}, "local_world_size: 0 must be an int within 1..1024"),
        ({"role": "a b"}, "role: 'a b' must be"),
        ({"entrypoint": ""}, "entrypoint: '' must not be empty"),
        ({"entrypoint": 3}, "entrypoint: 3 must be a command or a function"),
        ({"max_restarts": -1}, "max_restarts: -1 must be >= 0"),
        ({"monitor_interval": 0}, "monitor_interval: 0 must be > 0"),
        ({"stop_timeout": -1}, "stop_timeout: -1 must be >= 0"),
        # nan broke neither rule (a comparison with it is false); inf never polled, never killed
        ({"monitor_interval": float("nan")}, "monitor_interval: nan must be > 0"),
        ({"monitor_interval": float("inf")}, "monitor_interval: inf must be > 0"),
        ({"stop_timeout": float("nan")}, "stop_timeout: nan must be >= 0 seconds, finite"),
        ({"stop_timeout": float("inf")}, "stop_timeout: inf must be >= 0 seconds, finite"),
        ({"master_port": 70000}, "master_port: 70000 must be within"),
        ({"log_line_prefix_template": "{x}"}, "unknown field"),
    ],
)
def test_worker_spec_validation(kw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(")):
        spec(**kw)


@pytest.mark.parametrize("name", ["../../etc", "a/b", ".hidden", "-x", "", "x" * 129, "é"])
def test_run_ids_and_roles_must_be_one_safe_path_component(name):
    with pytest.raises(ConfigError, match=r"must be 1\.\.128 characters"):
        check_name("run_id", name)
    with pytest.raises(ConfigError, match=r"role: .* must be 1\.\.128 characters"):
        spec(role=name)


def test_a_local_elastic_agent_refuses_an_unsafe_run_id(tmp_path):
    from agentd.agent.local import LocalElasticAgent
    from agentd.rendezvous.static import StaticRendezvous

    unsafe = spec(rdzv_handler=StaticRendezvous(run_id="../escape"))
    logs = tmp_path / "logs"
    logs.mkdir()
    with pytest.raises(ConfigError, match=r"run_id: '../escape' must be"):
        LocalElasticAgent(unsafe, log_dir=logs)
    assert list(logs.iterdir()) == []  # nothing escaped to ../escape either
    assert not (tmp_path / "escape").exists()


def test_worker_spec_defaults_and_names():
    s = spec(args=["-u", "train.py", "--x"], stop_signal=15)
    assert s.stop_signal is signal.SIGTERM
    assert s.get_entrypoint_name() == "train.py"
    assert spec(entrypoint="/bin/echo").get_entrypoint_name() == "echo"
    assert spec(entrypoint=len).get_entrypoint_name() == "len"
    assert [w.local_rank for w in WorkerGroup(s).workers] == [0, 1]
    assert WorkerGroup(s).state is WorkerState.INIT


def test_rank_assignment_single_and_multi_role():
    infos = [
        RoleInstanceInfo("trainer", 0, 2),
        RoleInstanceInfo("ps", 1, 1),
        RoleInstanceInfo("trainer", 2, 3),
    ]
    workers = assign_worker_ranks(infos, 2, spec(local_world_size=3))
    assert [w.global_rank for w in workers] == [3, 4, 5]
    assert [w.role_rank for w in workers] == [2, 3, 4]
    assert {w.world_size for w in workers} == {6}
    assert {w.role_world_size for w in workers} == {5}
    [w0, w1] = assign_worker_ranks([RoleInstanceInfo("trainer", 0, 2)], 0, spec())
    assert (w0.global_rank, w1.global_rank, w1.world_size) == (0, 1, 2)


def test_root_cause_is_first_failure():
    def failure(rank, ts):
        return WorkerFailure(rank, 100 + rank, 1, global_rank=rank, role="r", timestamp=ts)

    result = RunResult(WorkerState.FAILED, failures={0: failure(0, 5.0), 1: failure(1, 4.0)})
    assert result.root_cause.global_rank == 1
    assert result.is_failed()
    assert RunResult(WorkerState.SUCCEEDED).root_cause is None
    assert WorkerFailure(0, 1, -9).signal_name() == "SIGKILL"
    assert WorkerFailure(0, 1, 3).signal_name() == ""


def test_rdzv_conf_variables_lose_only_their_password():
    from agentd.support.secrets import without_secrets

    env = without_secrets(
        {
            "PET_RDZV_CONF": "join_timeout=5, password = pw ,key_prefix=/x",
            "AGENTD_STORE_TOKEN": "t",
            "PATH": "/bin",
        }
    )
    assert env == {"PET_RDZV_CONF": "join_timeout=5,key_prefix=/x", "PATH": "/bin"}


def test_a_numa_binding_is_refused_in_one_line():
    """torch binds workers to NUMA nodes when given ``numa_options``; agentd does not, and
    says so at once rather than run them unbound."""
    with pytest.raises(ConfigError, match=r"numa_options: .* NUMA binding is not supported"):
        WorkerSpec("trainer", 1, entrypoint="python", numa_options=object())
