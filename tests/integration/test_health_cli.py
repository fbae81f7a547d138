"""``agentd status`` and ``--event-log`` against a real ``agentd run``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import WORKER, wait_until


def status(*args: str, url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agentd", "status", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=30,
    )


def health_url(agent) -> str:
    import re

    match = wait_until(
        lambda: re.search(r"Health endpoint on (http://\S+)", agent.stderr()),
        what="the health endpoint",
    )
    return match.group(1)


def test_status_table_json_and_checks(run_agentd, tmp_path):
    events = tmp_path / "events.jsonl"
    agent = run_agentd(
        "--health-port", "0", "--nproc-per-node", "2", "--event-log", str(events), WORKER, "sleep"
    )
    agent.wait_ready(2)
    url = health_url(agent)
    table = status(url=url)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert "state HEALTHY" in lines[0]
    assert lines[4].split() == ["LOCAL", "RANK", "PID", "STATE", "UP", "CPU", "s", "RSS", "MiB"]
    assert [ln.split()[0] for ln in lines[5:7]] == ["0", "1"]
    doc = json.loads(status("--json", url=url).stdout)
    assert doc["state"] == "HEALTHY" and len(doc["workers"]) == 2
    live = status("--check", "livez", url=url)
    assert (live.returncode, live.stdout) == (0, "ok\n")
    port = url.rsplit(":", 1)[1]
    for named in ([port], [f"127.0.0.1:{port}"], ["--health-port", port]):  # as a user types
        argv = [sys.executable, "-m", "agentd", "status", *named, "--check", "livez"]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
        assert (done.returncode, done.stdout) == (0, "ok\n"), (named, done.stderr)
    assert status("--check", "readyz", url=url).returncode == 0
    job = json.loads(status("--job", "--json", url=url).stdout)  # standalone: one row, live
    assert (job["size"], job["spares"], job["store"]) == (1, 0, None)
    [row] = job["nodes"]
    assert (row["state"], row["ranks"], row["host"]) == ("HEALTHY", [0, 1], doc["host"])
    assert (row["steps"], row["step_rate"]) == (None, None)  # its workers report no steps
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait() == 143
    gone = status(url=url)
    assert gone.returncode == 3 and "cannot reach the agent" in gone.stderr
    names = [json.loads(line)["name"] for line in events.read_text().splitlines()]
    assert names[0] == "agent_started"
    assert "state_changed" in names
    record = json.loads(events.read_text().splitlines()[-1])
    assert record["metadata"]["new"] == "STOPPED"


def test_failure_shows_in_status_and_events(run_agentd, tmp_path):
    events = tmp_path / "events.jsonl"
    agent = run_agentd(
        "--health-port",
        "0",
        "--max-restarts",
        "1",
        "--event-log",
        str(events),
        WORKER,
        "crash",
        "--code",
        "7",
        "--after",
        "0.1",
    )
    assert agent.wait() == 1
    docs = [json.loads(line) for line in events.read_text().splitlines()]
    failed = [d for d in docs if d["name"] == "worker_failed"]
    assert len(failed) == 2 and failed[0]["source"] == "WORKER"
    assert failed[0]["metadata"]["exitcode"] == 7 and "traceback" not in failed[0]["metadata"]
    assert [d["metadata"]["reason"] for d in docs if d["name"] == "restart"] == ["failure"]


def test_job_flags_that_do_not_go_together_exit_2():
    url = "http://127.0.0.1:9"
    watch = status("--watch", "1", url=url)
    assert watch.returncode == 2 and "--watch: redraws the job view only: add --job" in watch.stderr
    check = status("--job", "--check", "livez", url=url)
    assert check.returncode == 2 and "--check: a probe of one agent, not with --job" in check.stderr
    fast = status("--job", "--watch", "0.01", url=url)
    assert fast.returncode == 2 and "--watch: 0.01 must be within 0.1..3600 seconds" in fast.stderr
    gone = status("--job", url=url)
    assert gone.returncode == 3 and "cannot reach the agent at http://127.0.0.1:9" in gone.stderr


@pytest.mark.parametrize("command", ["status", "drain", "logs"])
def test_the_url_may_be_given_as_logs_takes_it(command):
    """``agentd status URL``, ``agentd drain URL`` and ``agentd logs URL``: the URL the
    agent's start line printed, pasted, or its port alone (``--health-port``'s); naming two
    agents at once is a usage error."""

    def agentd(*args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "agentd", command, *args, "--timeout", "2"]
        return subprocess.run(argv, capture_output=True, text=True, timeout=30)

    for named in (["http://127.0.0.1:9"], ["9"], [":9"], ["--health-port", "9"]):
        gone = agentd(*named)
        assert gone.returncode == 3 and "http://127.0.0.1:9" in gone.stderr, (named, gone.stderr)
    same = agentd("http://127.0.0.1:9", "--url", "http://127.0.0.1:9", "--health-port", "9")
    assert same.returncode == 3, same.stderr
    two = agentd("http://127.0.0.1:9", "--url", "http://127.0.0.1:10")
    assert two.returncode == 2
    assert "URL: 'http://127.0.0.1:9' and --url 'http://127.0.0.1:10' name two agents" in (
        two.stderr
    )
    port = agentd("9", "--health-port", "10")
    assert port.returncode == 2
    assert "URL: '9' and --health-port '10' name two agents" in port.stderr, port.stderr


def test_bad_health_flags_exit_2(run_agentd):
    agent = run_agentd("--health-port", "99999", WORKER)
    assert agent.wait() == 2
    assert "--health-port: '99999' must be <= 65535" in agent.stderr()
    agent = run_agentd("--health-host", "not a host!!", "--health-port", "0", WORKER)
    assert agent.wait() == 2  # a usage error, not a failure to listen (3)
    assert agent.stderr() == (
        "agentd: error: --health-host: 'not a host!!' must be an IP "
        "address or a host name (letters, digits, '-' and '_' in "
        "dot-separated labels)\n"
    )


def test_the_health_endpoint_over_tls(run_agentd, tmp_path):
    """--health-cert and --health-key: probes, status and drains over https, verified
    against the operator's CA; plain http gets nothing from it."""
    import re
    import urllib.request

    from tests.helpers.tls import make_ca, node_tls

    ca = make_ca(tmp_path / "tls")
    node = node_tls(tmp_path / "tls", "node", ca)
    agent = run_agentd(
        "--standalone",
        "--health-port",
        "0",
        "--health-cert",
        str(node.cert),
        "--health-key",
        str(node.key),
        WORKER,
        "sleep",
        env={"AGENTD_DRAIN_TOKEN": "drain-secret"},
    )
    agent.wait_ready(1)
    url = wait_until(
        lambda: re.search(r"Health endpoint on (https://\S+)", agent.stderr()),
        what="an https endpoint",
    ).group(1)
    live = status("--check", "livez", "--cacert", str(ca), url=url)
    assert (live.returncode, live.stdout) == (0, "ok\n"), live.stderr
    untrusted = status("--check", "livez", url=url)  # the system's CAs do not know it
    assert untrusted.returncode == 3 and "CERTIFICATE_VERIFY_FAILED" in untrusted.stderr
    plain = url.replace("https://", "http://")
    try:
        urllib.request.urlopen(plain + "/livez", timeout=5)
        raise AssertionError("plain http answered")
    except OSError:
        pass
    drain = subprocess.run(
        [sys.executable, "-m", "agentd", "drain", "--url", url, "--cacert", str(ca)],
        env={**os.environ, "AGENTD_DRAIN_TOKEN": "drain-secret"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert drain.returncode == 0, drain.stderr
    assert agent.wait(60) == 5  # the only node drained: it ends here, unfinished


def test_a_certificate_without_its_key_is_a_usage_error(run_agentd, tmp_path):
    agent = run_agentd("--health-port", "0", "--health-cert", str(tmp_path / "c.pem"), WORKER)
    assert agent.wait() == 2
    assert "--health-cert: needs --health-key" in agent.stderr()
    (tmp_path / "c.pem").write_text("not a certificate")
    (tmp_path / "k.pem").write_text("not a key")
    flags = ("--health-cert", str(tmp_path / "c.pem"), "--health-key", str(tmp_path / "k.pem"))
    agent = run_agentd("--health-port", "0", *flags, WORKER, "ok")
    assert agent.wait() == 2
    assert f"--health-cert: '{tmp_path / 'c.pem'}' with --health-key" in agent.stderr()


def test_status_with_no_agent_listening_says_how_to_reach_one():
    """The health endpoint is off by default: a bare ``agentd status`` says so."""
    from tests.conftest import free_port

    env = {k: v for k, v in os.environ.items() if k != "AGENTD_STATUS_URL"}
    env["AGENTD_HEALTH_PORT"] = str(free_port())
    done = subprocess.run(
        [sys.executable, "-m", "agentd", "status"], capture_output=True, text=True, env=env
    )
    assert done.returncode == 3
    assert "cannot reach the agent" in done.stderr
    assert "runs with --health-port" in done.stderr and "pass that agent's URL" in done.stderr


def start_watch(url: str, tmp_path) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``agentd status --job --watch 0.2`` of ``url``: the process, its screen and errors."""
    screen, errors = tmp_path / "watch.out", tmp_path / "watch.err"
    argv = [sys.executable, "-m", "agentd", "status", "--job", "--watch", "0.2", "--url", url]
    with open(screen, "wb") as out, open(errors, "wb") as err:
        watch = subprocess.Popen(argv, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
    return watch, screen, errors


@pytest.mark.parametrize("end", ["succeeded", "killed"])
def test_a_watch_ends_with_the_job(run_agentd, tmp_path, end):
    """``agentd status --job --watch`` of a job that ends well draws its final view and
    exits 0 (the agent's exit waits for it); of an agent killed, it leaves the last view
    and exits 3 saying so. It used to lose the agent between two requests and end in
    ``cannot reach`` (exit 3) though the job had ended well."""
    stop = tmp_path / "stop"
    agent = run_agentd("--health-port", "0", WORKER, "member", "--stop-file", str(stop))
    url = health_url(agent)
    watch, screen, errors = start_watch(url, tmp_path)
    try:
        wait_until(lambda: b"HEALTHY" in screen.read_bytes(), what="the watch's first view")
        if end == "succeeded":
            stop.touch()
            assert agent.wait() == 0
            assert watch.wait(timeout=30) == 0, errors.read_text()
            last = screen.read_text().rsplit("\x1b[2J", 1)[1]
            assert "SUCCEEDED" in last.splitlines()[5], last
            assert "The run of node 0's agent, which answered, ended: SUCCEEDED." in last
            assert errors.read_text() == ""
        else:
            agent.proc.kill()
            assert watch.wait(timeout=30) == 3
            assert f"the agent at {url} stopped answering at" in errors.read_text()
            assert "The view above is the last it gave" in errors.read_text()
            assert "HEALTHY" in screen.read_text().rsplit("\x1b[2J", 1)[1]
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()


def test_a_watch_started_before_its_agent_waits_for_it(run_agentd, tmp_path):
    """``agentd status --job --watch`` typed as the job is launched, before its agent
    listens: it says it waits, then draws the job once the agent answers, to its end. It
    used to exit 3 at once (``cannot reach the agent``)."""
    from tests.conftest import free_port

    port, stop = free_port(), tmp_path / "stop"
    watch, screen, errors = start_watch(f"http://127.0.0.1:{port}", tmp_path)
    try:
        wait_until(lambda: b"for the agent to answer" in screen.read_bytes(), what="its wait")
        assert watch.poll() is None, errors.read_text()
        agent = run_agentd("--health-port", str(port), WORKER, "member", "--stop-file", str(stop))
        wait_until(lambda: b"HEALTHY" in screen.read_bytes(), what="the watch's first view")
        stop.touch()
        assert agent.wait() == 0
        assert watch.wait(timeout=30) == 0, errors.read_text()
        assert "SUCCEEDED" in screen.read_text().rsplit("\x1b[2J", 1)[1]
        assert errors.read_text() == ""
    finally:
        if watch.poll() is None:
            watch.kill()
            watch.wait()
