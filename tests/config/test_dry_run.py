"""``agentd run --dry-run``: every check, the options as resolved (a config file that
``--config`` reads back), secrets never shown, and nothing started."""

from __future__ import annotations

import subprocess
import sys
import tomllib

from tests.conftest import WORKER


def agentd(*args: str, env: dict[str, str] | None = None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "agentd", "run", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"PATH": "/usr/bin", **(env or {})},
        cwd=cwd,
    )


def test_the_options_resolved_are_printed_as_a_config_file_and_nothing_starts(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    given = ("--standalone", "--nproc-per-node", "2", "--tee", "3", "--node-check", "true")
    done = agentd(
        "--dry-run", *given, "--node-check", "test -d /", WORKER, "ok",
        env={"TEST_AGENTD_OUT": str(out), "AGENTD_MAX_RESTARTS": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert list(out.iterdir()) == []  # no worker ran (each writes its pid there)
    lines = done.stdout.splitlines()
    assert lines[0] == "# agentd run --dry-run: every check passed; nothing was started."
    assert lines[1] == (
        "# 2 worker(s), rendezvous agentd, first workers spawned, restarts forked from a bare "
        "zygote (auto: worker.py imports none of torch, numpy, Lightning, transformers)"
    )  # the agent's own start line
    assert 'max_restarts = "1"  # AGENTD_MAX_RESTARTS' in lines
    assert 'node_check = "true\\ntest -d /"  # --node-check' in lines
    config = tmp_path / "job.toml"
    config.write_text(done.stdout)
    assert tomllib.loads(done.stdout)["args"] == ["ok"]
    again = agentd("--dry-run", "--config", str(config))
    assert again.returncode == 0, again.stderr
    assert [line.split("  #")[0] for line in again.stdout.splitlines()] == [
        line.split("  #")[0] for line in lines
    ]  # the same values, now from the file
    ran = agentd("--config", str(config), env={"TEST_AGENTD_OUT": str(out)})
    assert ran.returncode == 0, ran.stderr
    assert sorted(ran.stdout.splitlines()) == [
        "[default0]:hello from rank 0",
        "[default1]:hello from rank 1",
    ]


def test_secrets_are_named_and_never_shown():
    done = agentd(
        *("--dry-run", "--rdzv-backend", "etcd", "--rdzv-endpoint", "127.0.0.1:1"),
        *("--nnodes", "1:2", "--rdzv-conf", "password=hunter2,username=u", "--health-port", "0"),
        WORKER,
        env={"AGENTD_DRAIN_TOKEN": "drain-s3cret", "AGENTD_STORE_TOKEN": "store-s3cret"},
    )
    assert done.returncode == 0, done.stderr
    for secret in ("hunter2", "drain-s3cret", "store-s3cret"):
        assert secret not in done.stdout + done.stderr
    assert 'rdzv_conf = "username=u"  # --rdzv-conf; its password is not shown' in done.stdout
    assert "# drain_token: set by AGENTD_DRAIN_TOKEN (a secret: not shown)" in done.stdout


def test_a_bad_option_fails_the_dry_run_as_it_fails_a_start():
    done = agentd("--dry-run", "--nproc-per-node", "zero", WORKER)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "--nproc-per-node: 'zero' must be an integer within" in done.stderr
