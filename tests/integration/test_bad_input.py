"""Bad input end to end: one line naming the field, the value and the rule, exit 2."""

from __future__ import annotations

import pytest

from tests.conftest import WORKER


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--max-restarts", "-1", WORKER], "--max-restarts: '-1' must be >= 0"),
        (
            ["--nproc-per-node", "zero", WORKER],
            "--nproc-per-node: 'zero' must be an integer within",
        ),
        (["--stop-signal", "SIGNOPE", WORKER], "--stop-signal: 'SIGNOPE' is not a signal"),
        (  # a drain would kill every worker instead of asking it to checkpoint
            ["--checkpoint-signal", "SIGKILL", WORKER],
            "--checkpoint-signal: 'SIGKILL' cannot be SIGKILL: a worker cannot catch it",
        ),
        (
            ["--timer-dump-signal", "STOP", WORKER],
            "--timer-dump-signal: 'STOP' cannot be SIGSTOP: a worker cannot catch it",
        ),
        (["--redirects", "7", WORKER], "--redirects: '7' must be 0-3"),
        (["--bogus-flag", WORKER], "unrecognized arguments: --bogus-flag"),
        (
            ["--nproc-per-nodes", "2", WORKER],
            "unrecognized arguments: --nproc-per-nodes (did you mean --nproc-per-node?)",
        ),
        (["missing_script.py"], "script: 'missing_script.py' does not exist"),
        (["-m", "no_such_module_xyz"], "no module named 'no_such_module_xyz'"),
        (["--no-python", "no-such-binary-xyz"], "'no-such-binary-xyz' is not on PATH"),
        (["--nnodes", "1:2", WORKER], "--nnodes: '1:2' needs an elastic backend"),
        (["--nnodes", "2", "--node-rank", "2", WORKER], "--node-rank: 2 must be within 0..1"),
        (["--standalone", "--nnodes", "2", WORKER], "cannot be combined with --standalone"),
        (["--rdzv-backend", "c10d", "--nnodes", "2", WORKER], "--rdzv-endpoint: required"),
        (
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:x", WORKER],
            "--rdzv-endpoint: '127.0.0.1:x' has no valid port",
        ),
        (
            ["--nnodes", "2", "--rdzv-endpoint", "127.0.0.1:x", WORKER],  # static's master
            "--rdzv-endpoint: '127.0.0.1:x' has no valid port",
        ),
        (
            ["--nnodes", "2", "--rdzv-conf", "timeout=soon", WORKER],
            "--rdzv-conf: timeout='soon' must be a number of seconds > 0",
        ),
        (
            ["--standalone", "--rdzv-conf", "join_timeout=-1", WORKER],
            "--rdzv-conf: join_timeout='-1' must be a number of seconds > 0",
        ),
        (
            ["--standalone", "--rdzv-conf", "bogus=1", WORKER],
            "--rdzv-conf: 'bogus' is not a setting of the agentd backend",
        ),
        (
            ["--standalone", "--rdzv-conf", "novalue", WORKER],
            "--rdzv-conf: 'novalue' must be key=value",
        ),
        (["--log-line-prefix-template", "{nope}", WORKER], "unknown field(s) ['nope']"),
        (
            ["--log-line-prefix-template", "{rank:>99999999}", WORKER],
            "field {rank} may not have a format spec",
        ),
        (["--rdzv-id", "../../etc", WORKER], "--rdzv-id: '../../etc' must be 1..128 characters"),
        (["--rdzv-id", "a/b", WORKER], "--rdzv-id: 'a/b' must be 1..128 characters"),
        (["--rdzv-id", "x" * 5000, WORKER], "--rdzv-id: 'xxxxxxxx"),
        (["--role", "../up", WORKER], "--role: '../up' must be 1..128 characters"),
        (
            ["--nproc-per-node", "100000", WORKER],
            "--nproc-per-node: '100000' must be an integer within 1..1024",
        ),
        (
            [
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                "127.0.0.1:1",
                "--nnodes",
                "1:999999999999999999999",
                WORKER,
            ],
            "--nnodes: '1:999999999999999999999' must be at most 65536 nodes",
        ),
        (
            ["--rdzv-backend", "c10d", "--rdzv-endpoint", "[::1", WORKER],
            "--rdzv-endpoint: '[::1' must be host:port, or [IPv6]:port",
        ),
        (  # static's master: it used to be served on ':::::29500' and waited for ever
            ["--nnodes", "2", "--rdzv-endpoint", "::::", WORKER],
            "--rdzv-endpoint: '::::' must be host:port, or [IPv6]:port",
        ),
        (
            ["--non-retryable-exit-codes", "1,,2", WORKER],
            "--non-retryable-exit-codes: '1,,2' has an empty item",
        ),
        (["--rdzv-backend", "etcd", WORKER], "--rdzv-endpoint: required by --rdzv-backend etcd"),
        (  # one line: no warning first about the token that crosses the network
            [
                *("--rdzv-backend", "c10d", "--rdzv-endpoint", "node0.example:29400"),
                *("--rdzv-conf", "is_host=1", WORKER),
            ],
            "--store-token: required to host the store on 'node0.example', which is not",
        ),
        (
            [
                "--rdzv-backend",
                "etcd-v2",
                "--rdzv-endpoint",
                "h",
                "--rdzv-conf",
                "is_host=1",
                WORKER,
            ],
            "--rdzv-conf: 'is_host' is not a setting of the etcd-v2 backend",
        ),
    ],
)
def test_bad_input_one_line_exit_2(run_agentd, args, message):
    agent = run_agentd(*args)
    assert agent.wait() == 2
    err = agent.stderr()
    assert err.count("\n") == 1, err
    assert message in err
    assert list(agent.out_dir.glob("pid_*")) == []


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--standalone", "--local-addr", "192.0.2.1"], "--local-addr"),
        (["--nnodes", "1", "--master-addr", "192.0.2.1"], "--master-addr"),
        (["--nnodes", "1", "--rdzv-endpoint", "192.0.2.1:0"], "--rdzv-endpoint"),
        # a pinned port: the address is still what is wrong (it named --master-port)
        (["--standalone", "--local-addr", "192.0.2.1", "--master-port", "29555"], "--local-addr"),
        # the health endpoint's address (it named health_port)
        (["--standalone", "--health-host", "192.0.2.1", "--health-port", "0"], "--health-host"),
    ],
)
def test_a_job_of_one_node_at_an_address_not_ours_is_one_line_exit_3(run_agentd, args, flag):
    """The workers' store of a job of one node (and the health endpoint) listens on the
    address given: one that this host does not have ends the agent with one line naming
    the option that gave it (it was a traceback, then the port's option)."""
    agent = run_agentd(*args, WORKER, "ok")
    assert agent.wait(30) == 3
    err = agent.stderr()
    assert f"{flag}: '192.0.2.1' is not an address of this host" in err
    assert "Traceback" not in err
    assert list(agent.out_dir.glob("pid_*")) == []


def test_bad_config_file_and_env(run_agentd, tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('max_restarts = "many"\n')
    agent = run_agentd("--config", str(bad), WORKER)
    assert agent.wait() == 2
    assert agent.stderr() == f"agentd: error: {bad}: max_restarts: 'many' is not an integer\n"
    agent = run_agentd(WORKER, env={"AGENTD_STOP_TIMEOUT": "-1"})
    assert agent.wait() == 2
    assert agent.stderr() == "agentd: error: AGENTD_STOP_TIMEOUT: '-1' must be >= 0\n"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("script = 5\n", "script: 5 must be a non-empty string"),
        ('args = "notalist"\n', "args: 'notalist' must be a list of strings"),
    ],
)
def test_a_broken_job_in_the_config_file_fails_even_when_the_cli_names_one(
    run_agentd, tmp_path, text, message
):
    bad = tmp_path / "job.toml"
    bad.write_text(text)
    agent = run_agentd("--config", str(bad), WORKER, "ok")
    assert agent.wait() == 2
    assert agent.stderr() == f"agentd: error: {bad}: {message}\n"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--url", "notaurl"], "--url: 'notaurl' must be an http(s)://host:port URL"),
        (["--url", "http://127.0.0.1:99999"], "is not a valid URL (Port out of range"),
        (["--health-port", "0"], "--health-port: '0' must be a port, 1..65535"),
        (["--health-port", "http://h:1"], "--health-port: 'http://h:1' must be a port"),
        (["9", "--health-port", "99999"], "--health-port: '99999' must be a port, 1..65535"),
        # the command's own flags are the ones suggested: not run's, nor the flag given
        (
            ["--health-prt", "1"],
            "unrecognized arguments: --health-prt (did you mean --health-port?)",
        ),
        (["--nproc-per-node", "2"], "unrecognized arguments: --nproc-per-node\n"),
    ],
)
def test_status_with_a_bad_url_is_one_line_exit_2(run_agentd, args, message):
    agent = run_agentd(*args, command="status")
    assert agent.wait() == 2
    assert agent.stderr().count("\n") == 1 and message in agent.stderr(), agent.stderr()


@pytest.mark.parametrize("command", ["status", "drain", "logs"])
@pytest.mark.parametrize(
    ("args", "env", "message"),
    [
        (["70000"], {}, "URL: '70000' must be a port, 1..65535"),
        (["--url", "ftp://h:1"], {}, "--url: 'ftp://h:1' must be an http(s)://host:port URL"),
        ([], {"AGENTD_HEALTH_PORT": "99999"}, "AGENTD_HEALTH_PORT: '99999' must be a port"),
        ([], {"AGENTD_STATUS_URL": "ftp://h:1"}, "AGENTD_STATUS_URL: 'ftp://h:1' must be an"),
        # logs and drain passed a negative timeout to urllib: a traceback
        (["--timeout", "-1"], {}, "--timeout: -1 must be more than 0 and at most 3600 seconds"),
        (["--timeout", "nan"], {}, "--timeout: nan must be more than 0 and at most 3600"),
    ],
)
def test_each_command_that_asks_an_agent_names_where_a_bad_endpoint_came_from(
    run_agentd, command, args, env, message
):
    """``status``, ``drain`` and ``logs`` name the argument or variable that gave the
    endpoint (drain said ``--url`` and logs ``URL`` whatever the user had typed), and
    refuse a timeout that is no wait."""
    agent = run_agentd(*args, command=command, env=env)
    assert agent.wait() == 2
    err = agent.stderr()
    assert err.startswith(f"agentd: error: {message}") and err.count("\n") == 1, err


def test_config_file_and_pet_env(run_agentd, tmp_path):
    config = tmp_path / "job.toml"
    config.write_text(f'nproc-per-node = 2\nscript = "{WORKER}"\nargs = ["ok"]\n')
    agent = run_agentd("--config", str(config), env={"PET_NPROC_PER_NODE": "3"})
    assert agent.wait() == 0, agent.stderr()
    assert len(agent.stdout().splitlines()) == 3  # PET_ beats the file


def test_a_taken_master_port_is_one_line_naming_the_flag(run_agentd, torch_worker):
    """No zygote traceback, no word of a "new store": the flag, the port and why."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        agent = run_agentd("--standalone", "--master-port", str(port), *torch_worker, "ok")
        assert agent.wait() == 3
    err = agent.stderr()
    assert f"--master-port: cannot listen on 127.0.0.1:{port} (Address already in use)" in err
    assert "Traceback" not in err and "the store is new" not in err


def test_a_mistyped_variable_is_warned_of_and_the_job_runs(run_agentd):
    """A misspelt ``AGENTD_*`` variable used to be ignored in silence: the job started with
    the default. It is named with the one meant, and the job still runs (a variable of a
    newer agentd must not stop an older one)."""
    agent = run_agentd(WORKER, "ok", env={"AGENTD_NPROC_PER_NOD": "2"})
    assert agent.wait() == 0, agent.stderr()
    assert len(agent.stdout().splitlines()) == 1  # the default, one worker
    assert (
        "WARNING agentd: AGENTD_NPROC_PER_NOD is not a variable agentd reads: ignored "
        "(did you mean AGENTD_NPROC_PER_NODE?)"
    ) in agent.stderr()
    status = run_agentd("http://127.0.0.1:1", command="status", env={"AGENTD_STATUS_UR": "x"})
    assert status.wait() == 3  # nothing listens there
    assert status.stderr().startswith(
        "agentd: warning: AGENTD_STATUS_UR is not a variable agentd reads: ignored "
        "(did you mean AGENTD_STATUS_URL?)\n"
    ), status.stderr()


def test_a_path_the_agent_cannot_use_is_named_as_the_option_was_given(run_agentd, tmp_path):
    """The agent's parts name the field (``log_dir: ...``); the line names the flag or the
    variable the user gave, exit 3."""
    agent = run_agentd("--log-dir", "/proc/no-such-dir", WORKER, "ok", log_dir=False)
    assert agent.wait() == 3
    assert "ERROR agentd: --log-dir: cannot create /proc/no-such-dir/" in agent.stderr()
    missing = tmp_path / "missing" / "events.jsonl"
    agent = run_agentd(WORKER, "ok", env={"AGENTD_EVENT_LOG": str(missing)})
    assert agent.wait() == 3
    assert f"ERROR agentd: AGENTD_EVENT_LOG: cannot open {missing}: No such" in agent.stderr()
