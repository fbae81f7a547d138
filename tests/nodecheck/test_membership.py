"""Health-gated membership with real agents: a host failing its checks leaves the job and
comes back when they pass; one that keeps failing gives up."""

from __future__ import annotations

import json
import re
import signal
import urllib.request

from tests.conftest import WORKER, wait_until
from tests.helpers.jobs import (
    STEADY_MEMBER,
    TOKEN,
    agent_args,
    latest_attempt,
    member_job,
    members,
    one_round,
)


def restart_counts(agent, attempt: int) -> set[str]:
    return {m["TORCHELASTIC_RESTART_COUNT"] for m in members(agent, attempt)}


def flag_check(flag) -> list[str]:
    return ["--node-check", f"test ! -e {flag} || {{ echo 'bad host: {flag.name}'; exit 1; }}"]


def test_a_failing_host_leaves_the_job_and_joins_again_when_it_passes(
    run_agentd, run_store, tmp_path
):
    store = run_store()
    stop, flag, events = tmp_path / "stop", tmp_path / "sick", tmp_path / "events.jsonl"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    healthy = [
        run_agentd(
            *agent_args(store.endpoint, "2:3", conf=STEADY_MEMBER), *member_job(stop), env=env
        )
        for _ in range(2)
    ]
    gated = run_agentd(
        *agent_args(store.endpoint, "2:3", conf=STEADY_MEMBER),
        *flag_check(flag),
        "--node-check-interval",
        "0.3",
        "--node-check-cooldown",
        "0.5",
        "--event-log",
        str(events),
        *member_job(stop),
        env=env,
    )
    agents = [*healthy, gated]
    wait_until(lambda: one_round(agents, 3), what="a job of three")  # whichever attempt
    three = {a.pid: latest_attempt(a) for a in agents}
    spent = {a.pid: restart_counts(a, three[a.pid]) for a in healthy}

    flag.touch()  # the host turns bad while its workers run
    # The others go on without it, and spend no restart.
    wait_until(lambda: one_round(healthy, 2, after=three), what="a job of two")
    for agent in healthy:
        assert restart_counts(agent, latest_attempt(agent)) == spent[agent.pid]
    assert "failed its node checks" in gated.stderr() and "leaving the job" in gated.stderr()
    wait_until(
        lambda: any("is out of the job: test ! -e" in a.stderr() for a in healthy),
        what="the others to say why the world is smaller",
    )

    two = {a.pid: latest_attempt(a) for a in agents}
    flag.unlink()  # healthy again: it joins, and the job grows back to three
    wait_until(lambda: one_round(agents, 3, after=two), what="a job of three again")
    stop.touch()
    assert [a.wait(30) for a in (*healthy, gated)] == [0, 0, 0]
    names = [json.loads(line)["name"] for line in events.read_text().splitlines()]
    assert "node_excluded" in names and "node_readmitted" in names
    excluded = next(
        json.loads(line)
        for line in events.read_text().splitlines()
        if json.loads(line)["name"] == "node_excluded"
    )
    assert "bad host: sick" in excluded["metadata"]["reason"]


def test_a_host_that_keeps_failing_gives_up_with_exit_code_4(run_agentd, tmp_path, torch_worker):
    flag = tmp_path / "sick"
    flag.touch()
    agent = run_agentd(
        "--standalone",
        *flag_check(flag),
        "--node-check-cooldown",
        "0.05",
        "--node-check-max-exclusions",
        "2",
        *torch_worker,
        "ok",
    )
    assert agent.wait(60) == 4, agent.stderr()[-2000:]
    assert (
        "node checks failed 3 times within 60 min (--node-check-max-exclusions 2); "
        "giving up: test ! -e" in agent.stderr()
    )
    assert "bad host: sick" in agent.stderr()
    assert not list(agent.out_dir.glob("member_*")), "no worker ever started"


def test_a_bad_check_is_a_one_line_usage_error(run_agentd):
    agent = run_agentd("--standalone", "--node-check", "builtin:gpu", WORKER, "ok")
    assert agent.wait(30) == 2
    assert agent.stderr().strip() == (
        "agentd: error: --node-check: 'builtin:gpu' names an unknown built-in 'builtin:gpu' "
        "(the built-ins are builtin:disk[=SIZE], builtin:gpus[=N] and builtin:store)"
    )


def test_a_stop_signal_ends_the_cooldown_at_once(run_agentd, tmp_path):
    flag = tmp_path / "sick"
    flag.touch()
    agent = run_agentd(
        "--standalone", *flag_check(flag), "--node-check-cooldown", "600", WORKER, "ok"
    )
    wait_until(lambda: "stays out of the job for 600s" in agent.stderr(), what="an exclusion")
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(30) == 128 + signal.SIGTERM


def test_status_and_metrics_show_the_checks(run_agentd, tmp_path):
    stop = tmp_path / "stop"
    agent = run_agentd(
        "--standalone",
        "--health-port",
        "0",
        "--node-check",
        "true",
        "--node-check",
        "builtin:disk=1B",
        "--node-check-interval",
        "0.2",
        *member_job(stop),
    )
    url = wait_until(
        lambda: re.search(r"Health endpoint on (http://\S+)", agent.stderr()),
        what="the health endpoint",
    ).group(1)
    wait_until(lambda: members(agent, 0), what="the worker")
    doc = json.loads(urllib.request.urlopen(url + "/status", timeout=10).read())["node_checks"]
    assert [(c["name"], c["ok"]) for c in doc["checks"]] == [("true", True), ("builtin:disk", True)]
    assert doc["excluded"] is None and doc["failures"] == {}
    metrics = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    assert 'agentd_node_check_failures_total{check="builtin:disk"} 0.0' in metrics
    assert "agentd_node_excluded 0.0" in metrics
    stop.touch()
    assert agent.wait(30) == 0
