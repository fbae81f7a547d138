from __future__ import annotations

import signal
from pathlib import Path

import pytest

from agentd.config.reference import example_toml, options_markdown
from agentd.config.resolve import OPTIONS, local_world_size, resolve
from agentd.exceptions import ConfigError
from agentd.restart_policy import RestartBackoff
from agentd.spec import Std

EXAMPLE = Path(__file__).parents[2] / "config" / "agentd.toml"


def test_defaults():
    config = resolve({"script": "t.py"}, {})
    assert config.nnodes == (1, 1)
    assert config.max_restarts == 0
    assert config.stop_signal is signal.SIGTERM
    assert config.stop_timeout == 30.0
    assert config.redirects is Std.NONE
    assert config.restart_backoff == RestartBackoff()
    assert config.signals_to_handle[:2] == (signal.SIGTERM, signal.SIGINT)
    assert config.sources == {}


def test_precedence_cli_agentd_pet_file_default(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text("max_restarts = 1\nstop-timeout = 5\nrole = 'from-file'\ntee = 3\n")
    env = {
        "AGENTD_MAX_RESTARTS": "2",
        "PET_MAX_RESTARTS": "3",
        "PET_STOP_TIMEOUT": "6",
        "PET_ROLE": "from-pet",
    }
    config = resolve({"script": "t.py", "max_restarts": "9"}, env, str(file))
    assert config.max_restarts == 9
    assert config.sources["max_restarts"] == "--max-restarts"
    config = resolve({"script": "t.py"}, env, str(file))
    assert config.max_restarts == 2 and config.sources["max_restarts"] == "AGENTD_MAX_RESTARTS"
    assert config.stop_timeout == 6.0 and config.role == "from-pet"
    assert config.tee is Std.ALL and config.sources["tee"] == f"{file}: tee"
    assert config.log_level == "INFO"


def test_file_describes_the_job(tmp_path):
    file = tmp_path / "c.toml"
    file.write_text(
        'script = "train.py"\nargs = ["--lr", "1"]\nnon_retryable_exit_codes = [2, 3]\n'
    )
    config = resolve({}, {}, str(file))
    assert (config.script, config.script_args) == ("train.py", ("--lr", "1"))
    assert config.non_retryable_exit_codes == {2, 3}
    config = resolve({"script": "other.py", "script_args": ["x"]}, {}, str(file))
    assert (config.script, config.script_args) == ("other.py", ("x",))


def test_rdzv_conf_in_a_file_is_a_table_a_list_or_a_string(tmp_path):
    """``rdzv_conf = {join_timeout = 5, is_host = false}``, as TOML writes settings."""
    from agentd.rendezvous.conf import parse_rdzv_conf

    file = tmp_path / "c.toml"
    for text in (
        "rdzv_conf = {join_timeout = 5, is_host = false}",
        'rdzv_conf = ["join_timeout=5", "is_host=false"]',
        'rdzv_conf = "join_timeout=5,is_host=false"',
    ):
        file.write_text(text + "\n")
        config = resolve({"script": "t.py"}, {}, str(file))
        assert parse_rdzv_conf(config.rdzv_conf) == {"join_timeout": "5", "is_host": "false"}


@pytest.mark.parametrize(
    ("cli", "env", "text", "message"),
    [
        ({"max_restarts": "x"}, {}, "", "--max-restarts: 'x' is not an integer"),
        ({}, {"AGENTD_MONITOR_INTERVAL": "0"}, "", "AGENTD_MONITOR_INTERVAL: '0' must be > 0"),
        ({}, {"PET_NNODES": "3:2"}, "", "PET_NNODES: '3:2' must have 1 <= MIN <= MAX"),
        ({}, {}, "stop_timeout = 'soon'", "stop_timeout: 'soon' is not a number"),
        ({}, {}, "bogus = 1", "bogus is not a known option (see agentd run --help)"),
        (
            {},
            {},
            "max_restart = 1",
            "max_restart is not a known option (did you mean max_restarts?",
        ),
        ({}, {}, "nproc_per_nodes = 2", "(did you mean nproc_per_node? see agentd run --help)"),
        ({}, {}, "role = {a = 1}", "role: {'a': 1} must be a string"),
        ({}, {}, "rdzv_conf = {a = {b = 1}}", "rdzv_conf: {'a': {'b': 1}} must be a string"),
        ({}, {}, "max_restarts = [", "is not valid TOML"),
        (  # both spellings: valid TOML, and one of the two was dropped unseen
            {},
            {},
            "nproc-per-node = 2\nnproc_per_node = 3",
            "nproc_per_node and nproc-per-node are one option: give it once",
        ),
        ({"signals_to_handle": "SIGKILL"}, {}, "", "cannot include SIGKILL"),
        ({"non_retryable_exit_codes": "300"}, {}, "", "within 1..255"),
        ({"local_ranks_filter": "a"}, {}, "", "list of local ranks"),
        ({"log_format": "xml"}, {}, "", "must be one of text, json"),
        ({"restart_backoff": "1:0"}, {}, "", "max must be >= the initial delay"),
        # nan broke no rule (every comparison is false); inf never restarted
        ({"restart_backoff": "nan"}, {}, "", "--restart-backoff: 'nan' must be finite numbers"),
        ({}, {"AGENTD_RESTART_BACKOFF": "1:inf"}, "", "'1:inf' must be finite numbers"),
        ({"module": True, "no_python": True}, {}, "", "cannot be combined"),
        ({"health_host": "not a host!!"}, {}, "", "--health-host: 'not a host!!' must be an IP"),
        ({}, {"PET_LOCAL_ADDR": "a b"}, "", "PET_LOCAL_ADDR: 'a b' must be an IP address or"),
        ({}, {}, "master_addr = '-x.example'", "master_addr: '-x.example' must be an IP"),
        ({"standby_workers": "x"}, {}, "", "--standby-workers: 'x' must be 'auto' or a whole"),
        ({"standby_workers": "-1"}, {}, "", "--standby-workers: '-1' must be 'auto' or within"),
    ],
)
def test_errors_name_source_value_rule(tmp_path, cli, env, text, message):
    file = tmp_path / "c.toml"
    file.write_text(text)
    with pytest.raises(ConfigError) as info:
        resolve({"script": "t.py", **cli}, env, str(file))
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_missing_script_and_missing_file(tmp_path):
    with pytest.raises(ConfigError, match="script: missing"):
        resolve({}, {})
    with pytest.raises(ConfigError, match="does not exist"):
        resolve({"script": "t.py"}, {}, str(tmp_path / "nope.toml"))


def test_nproc_per_node_values():
    assert local_world_size("4") == 4
    assert local_world_size("cpu") >= 1
    assert local_world_size("auto", {"CUDA_VISIBLE_DEVICES": "0,1"}) == 2
    assert local_world_size("gpu", {"CUDA_VISIBLE_DEVICES": "3"}) == 1
    with pytest.raises(ConfigError, match="needs a visible GPU"):
        local_world_size("gpu", {"CUDA_VISIBLE_DEVICES": ""})


def test_options_reference_page_is_current():
    page = Path(__file__).parents[2] / "docs" / "options.md"
    assert page.read_text() == options_markdown(), (
        "regenerate: python -m agentd.config.reference markdown > docs/options.md"
    )
    assert all(f"| `{option.flags[0]}` |" in page.read_text() for option in OPTIONS)


def test_example_config_is_current_and_complete():
    assert EXAMPLE.read_text() == example_toml(), (
        "regenerate: python -m agentd.config.reference toml > config/agentd.toml"
    )
    for option in OPTIONS:
        assert f"# {option.name} = " in EXAMPLE.read_text()


def test_example_config_values_parse(tmp_path):
    uncommented = "\n".join(
        line[2:] for line in example_toml().splitlines() if " = " in line and line.startswith("# ")
    )
    file = tmp_path / "all.toml"
    file.write_text(uncommented)
    config = resolve({}, {}, str(file))
    assert config == resolve({"script": "train.py", "script_args": ["--epochs", "10"]}, {})


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("h:1", ("h", 1)),
        ("h", ("h", 29400)),
        ("[::1]:5", ("::1", 5)),
        ("[::1]", ("::1", 29400)),
        ("::1", ("::1", 29400)),
        ("fe80::1%eth0", ("fe80::1%eth0", 29400)),
    ],
)
def test_endpoints_parse(text, expected):
    from agentd.support.net import split_endpoint

    assert split_endpoint(text) == expected


@pytest.mark.parametrize(
    "text", ["[::1", "[::1]x", ":5", "h:x", "h:70000", "a b:1", "h/p:1", "::::", "[::::]:5"]
)
def test_malformed_endpoints_are_refused(text):
    from agentd.support.net import split_endpoint

    with pytest.raises(ConfigError, match=r"--rdzv-endpoint: .* must be host:port|no valid port"):
        split_endpoint(text)


@pytest.mark.parametrize(("backend", "join_timeout"), [("c10d", 600.0), ("etcd", 5.0)])
def test_rdzv_conf_timeout_means_what_it_means_to_torchs_backend(backend, join_timeout):
    """torch's etcd backend takes ``timeout`` as the join timeout; its c10d backend does
    not (``join_timeout`` is), so a c10d job keeps its 600 s."""
    from agentd.rendezvous.conf import parse_rdzv_conf, settings_from_conf

    conf = parse_rdzv_conf("timeout=5")
    settings = settings_from_conf(conf, (1, 2), timeout_is_join=backend == "etcd")
    assert settings.join_timeout == join_timeout and conf == {}


def test_torchs_log_prefix_syntax_is_accepted_and_unknown_fields_are_named():
    template = "[${role_name}${local_rank}|${rank}]:"
    config = resolve({"log_line_prefix_template": template, "script": "x.py"}, {}, None)
    assert config.log_line_prefix_template == "[{role}{local_rank}|{rank}]:"
    with pytest.raises(ConfigError, match=r"unknown field \$\{host\}"):
        resolve({"log_line_prefix_template": "${host}", "script": "x.py"}, {}, None)


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("[::1]", "::1"),
        ("0.0.0.0", "0.0.0.0"),
        ("localhost", "localhost"),
        ("node-7.cluster.local.", "node-7.cluster.local."),
        ("compose_service_1", "compose_service_1"),
    ],
)
def test_hosts_that_are_accepted(text, value):
    assert resolve({"script": "x.py", "health_host": text}, {}).health_host == value


def test_the_drain_token_is_its_own_secret():
    from agentd.config.build import _health

    env = {"AGENTD_STORE_TOKEN": "s", "AGENTD_DRAIN_TOKEN": "d"}
    args = {"script": "train.py", "health_port": "0"}
    config = resolve(args, env)
    assert _health(config).token == "d"
    same = resolve(args, env | {"AGENTD_DRAIN_TOKEN": "s"})
    with pytest.raises(ConfigError, match="--drain-token: must differ from the store token"):
        _health(same)
    alone = resolve(args, {"AGENTD_STORE_TOKEN": "s"})
    assert _health(alone).token is None  # the agent makes one: never the store's


def test_agent_config_is_frozen_keyword_built_and_equal_whatever_its_sources():
    from agentd.config.resolve import AgentConfig

    config = resolve({"script": "train.py", "max_restarts": 2}, {})
    assert config.max_restarts == 2 and config.nproc_per_node == AgentConfig.nproc_per_node
    with pytest.raises(AttributeError, match="AgentConfig is frozen: cannot set max_restarts"):
        config.max_restarts = 3  # type: ignore[misc]
    with pytest.raises(TypeError, match=r"unknown field\(s\) max_restart$"):
        AgentConfig(script="train.py", max_restart=2)
    with pytest.raises(TypeError, match="script is required"):
        AgentConfig()
    same = AgentConfig(script="train.py", max_restarts=2, sources={"max_restarts": "file"})
    assert same == config and same != AgentConfig(script="train.py")
    assert repr(same).startswith("AgentConfig(script='train.py', script_args=()")


@pytest.mark.parametrize(
    ("cli", "preload", "message"),
    [
        (
            {"standby_workers": "2"},
            None,
            "--standby-workers: 2 needs a zygote to fork them from, and the workers are "
            "spawned (--preload off)",
        ),
        ({"standby_cuda": True}, None, "--standby-cuda: needs torch preloaded (--preload torch)"),
        ({"standby_cuda": True}, ("numpy",), "the preload is numpy (--preload)"),
        (
            {"standby_cuda": True, "virtual_local_rank": True},
            ("torch",),
            "--standby-cuda: cannot be combined with --virtual-local-rank",
        ),
    ],
)
def test_standby_options_are_checked_against_the_preload(cli, preload, message):
    from agentd.config.build import _standby_cuda

    config = resolve({"script": "t.py", **cli}, {})
    with pytest.raises(ConfigError) as info:
        _standby_cuda(config, preload, "--preload off" if preload is None else "--preload")
    assert message in str(info.value) and "\n" not in str(info.value)


def test_standby_defaults():
    from agentd.config.build import _standby_cuda

    config = resolve({"script": "t.py"}, {})
    assert config.standby_workers is None and config.standby_cuda is False
    assert _standby_cuda(config, None, "--preload off") is False  # nothing asked: fine
    config = resolve({"script": "t.py", "standby_workers": "0", "standby_cuda": True}, {})
    assert config.standby_workers == 0
    assert _standby_cuda(config, ("torch", "numpy"), "--preload") is True


def test_standbys_with_cuda_ready_get_the_survivors_state_by_cuda_ipc_unless_told(
    monkeypatch,
):
    """The fastest route measured with CUDA-ready standbys (docs/inprocess.md); a route
    the environment names is kept, and a job without them keeps the default (group)."""
    from agentd.config.build import worker_spec
    from agentd.inprocess.handover import CUDA_IPC, ROUTE_ENV

    monkeypatch.delenv(ROUTE_ENV, raising=False)
    cli = {"script": "t.py", "standalone": True, "preload": "torch"}
    with_standbys = {**cli, "standby_cuda": True}
    assert worker_spec(resolve(with_standbys, {})).env.get(ROUTE_ENV) == CUDA_IPC
    assert ROUTE_ENV not in worker_spec(resolve(cli, {})).env
    monkeypatch.setenv(ROUTE_ENV, "group")
    assert ROUTE_ENV not in worker_spec(resolve(with_standbys, {})).env


def test_standbys_asked_of_workers_auto_spawns_are_a_usage_error(tmp_path):
    """``--preload auto`` spawns a script that imports psutil before torch: standbys then
    have no zygote to come from, and the error says why the workers are spawned."""
    import subprocess
    import sys

    script = tmp_path / "job.py"
    script.write_text("import psutil\nimport torch\n")
    argv = [sys.executable, "-m", "agentd", "run", "--standalone", "--standby-workers", "2"]
    done = subprocess.run(
        [*argv, str(script)], capture_output=True, text=True, timeout=60, cwd=tmp_path
    )
    assert done.returncode == 2, done.stderr
    [line] = [ln for ln in done.stderr.splitlines() if "--standby-workers" in ln]
    assert "2 needs a zygote to fork them from, and the workers are spawned (auto: " in line
    assert "imports psutil" in line


def test_a_rendezvous_given_with_standalone_is_said_to_be_ignored(caplog):
    """torchrun replaces them in silence: a store meant to be met, or a malformed endpoint,
    passed unseen. The warning names where each came from and its value."""
    from agentd.config.build import worker_spec

    cli = {"script": "t.py", "standalone": True, "rdzv_endpoint": "node0:99999"}
    with caplog.at_level("WARNING", logger="agentd.config.unheeded"):
        worker_spec(resolve(cli, {"PET_RDZV_BACKEND": "c10d"}))
        [line] = [r.getMessage() for r in caplog.records if "ignored" in r.getMessage()]
        assert line.startswith("PET_RDZV_BACKEND 'c10d' and --rdzv-endpoint 'node0:99999' ignored")
        caplog.clear()
        worker_spec(resolve({"script": "t.py", "standalone": True}, {}))
        assert not [r for r in caplog.records if "ignored" in r.getMessage()]


def test_local_ranks_filtered_beyond_the_workers_are_said(caplog):
    """A filter naming no local rank of the node showed nothing, silently (as torchrun)."""
    from agentd.config.build import worker_spec

    def said(nproc: str, ranks: str) -> list[str]:
        caplog.clear()
        cli = {"script": "t.py", "nproc_per_node": nproc, "local_ranks_filter": ranks}
        with caplog.at_level("WARNING", logger="agentd.config.unheeded"):
            worker_spec(resolve(cli, {}))
        return [r.getMessage() for r in caplog.records if "--local-ranks-filter" in r.getMessage()]

    [line] = said("2", "5")
    assert "local rank(s) [5] are not among this node's 2 worker(s) (0..1)" in line
    assert line.endswith("no worker's output is shown")
    [line] = said("2", "1,2,3")
    assert line.endswith("only [1] shown on the console")
    assert said("4", "1,3") == []


def test_a_timer_file_without_the_file_timer_is_said_to_be_ignored(caplog):
    """The pipe is served only with ``--file-timer`` (torch's agents too): a path given
    alone, even one that cannot be created, did nothing in silence."""
    from agentd.config.build import worker_spec

    def said(cli: dict, environ: dict) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="agentd.config.unheeded"):
            worker_spec(resolve({"script": "t.py", **cli}, environ))
        return [r.getMessage() for r in caplog.records if "timer pipe" in r.getMessage()]

    [line] = said({"timer_file": "/no/such/dir/pipe"}, {})
    assert line.startswith("--timer-file ignored: the timer pipe is served only with --file-timer")
    [line] = said({}, {"TORCHELASTIC_TIMER_FILE": "/tmp/pipe"})
    assert line.startswith("TORCHELASTIC_TIMER_FILE ignored: the timer pipe")
    assert said({"timer_file": "/tmp/pipe", "file_timer": True}, {}) == []


def test_an_error_a_part_names_by_its_field_is_said_as_the_option_was_given():
    """The agent's parts name a field (``log_dir: ...``), as the Python API spells it; the
    command line says the flag, variable or file key that gave it."""
    config = resolve({"script": "t.py", "log_dir": "/x"}, {"AGENTD_EVENT_LOG": "/y"})
    assert config.as_given("log_dir: cannot create /x/r") == "--log-dir: cannot create /x/r"
    assert config.as_given("event_log: cannot open /y") == "AGENTD_EVENT_LOG: cannot open /y"
    assert config.as_given("health_host: 'h' is not") == "--health-host: 'h' is not"  # default
    assert config.as_given("store: cannot listen") == "store: cannot listen"  # not a field
    assert config.as_given("no field here") == "no field here"


def test_health_options_without_a_health_port_are_said_to_be_ignored(caplog):
    """``--health-host``, ``--health-cert`` and the drain token shape an endpoint that only
    ``--health-port`` serves; given alone they did nothing in silence. The token's value is
    never logged."""
    from agentd.config.build import worker_spec

    def said(cli: dict, environ: dict) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="agentd.config.unheeded"):
            worker_spec(resolve({"script": "t.py", **cli}, environ))
        return [r.getMessage() for r in caplog.records if "health endpoint" in r.getMessage()]

    token = {"AGENTD_DRAIN_TOKEN": "s3cret-s3cret"}
    [line] = said({"health_host": "127.0.0.2"}, token)
    assert line == (
        "--health-host and AGENTD_DRAIN_TOKEN ignored: no health endpoint is served "
        "without --health-port"
    )
    assert said({"health_host": "127.0.0.2", "health_port": "0"}, token) == []
    assert said({}, {}) == []


def test_node_check_options_without_a_node_check_are_said_to_be_ignored(caplog):
    from agentd.config.build import worker_spec

    def said(cli: dict) -> list[str]:
        caplog.clear()
        with caplog.at_level("WARNING", logger="agentd.config.unheeded"):
            worker_spec(resolve({"script": "t.py", **cli}, {}))
        return [r.getMessage() for r in caplog.records if "node check" in r.getMessage()]

    assert said({"node_check_interval": "5"}) == [
        "--node-check-interval ignored: no node check runs without --node-check"
    ]
    assert said({"node_check_interval": "5", "node_check": ["true"]}) == []
