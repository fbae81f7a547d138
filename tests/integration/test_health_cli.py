"""``agentd status`` and ``--event-log`` against a real ``agentd run``."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

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
    assert status("--check", "readyz", url=url).returncode == 0
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
