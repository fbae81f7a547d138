"""The Grafana dashboard and the Prometheus alert rules in deploy/ (issue 50): their PromQL
parses (``promtool``), the alerts fire on the scenarios in agentd-rules.test.yaml, and
every metric they name is one that running agents export (scraped from a real job of two
nodes with a store, heartbeats and the straggler comparison)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.conftest import TESTS, wait_until
from tests.helpers.jobs import STEADY_MEMBER, TOKEN, agent_args

DEPLOY = TESTS.parent / "deploy"
DASHBOARD = DEPLOY / "grafana" / "agentd.json"
RULES = DEPLOY / "prometheus" / "agentd-rules.yaml"
TRAIN = str(TESTS / "drain" / "train_steps.py")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


@pytest.fixture(scope="module")
def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("promtool is missing (Debian's prometheus package): .ci/run installs it")
        pytest.skip("needs promtool (Debian's prometheus package)")
    return found


def dashboard_queries() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def rule_queries() -> list[str]:
    return re.findall(r"^\s+expr: (.+)$", RULES.read_text(), re.MULTILINE)


def named_metrics(query: str) -> set[str]:
    return set(re.findall(r"\bagentd_[a-z_]+\b", query))


def test_the_dashboard_is_well_formed():
    doc = json.loads(DASHBOARD.read_text())
    ids = [panel["id"] for panel in doc["panels"]]
    assert len(ids) == len(set(ids)) and doc["uid"] == "agentd-job"
    for panel in doc["panels"]:
        assert panel["title"] and panel["description"] and panel["targets"], panel
        assert {"x", "y", "w", "h"} <= set(panel["gridPos"]), panel
    assert len(dashboard_queries()) >= 12


def test_every_query_parses_and_the_alerts_fire_as_tested(promtool, tmp_path):
    rules = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True, text=True)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    scenarios = subprocess.run(
        [promtool, "test", "rules", "agentd-rules.test.yaml"],
        capture_output=True,
        text=True,
        cwd=RULES.parent,
    )
    assert scenarios.returncode == 0, scenarios.stdout + scenarios.stderr
    # the dashboard's queries, with Grafana's variables filled in, as recording rules
    records = []
    for i, query in enumerate(dashboard_queries()):
        for variable, value in GRAFANA_VARIABLES.items():
            query = query.replace(variable, value)
        records.append(f"      - record: dashboard:query{i}\n        expr: {json.dumps(query)}")
    checked = tmp_path / "dashboard-rules.yaml"
    checked.write_text("groups:\n  - name: dashboard\n    rules:\n" + "\n".join(records) + "\n")
    parsed = subprocess.run(
        [promtool, "check", "rules", str(checked)], capture_output=True, text=True
    )
    assert parsed.returncode == 0, parsed.stdout + parsed.stderr


def test_every_metric_named_is_one_a_running_agent_exports(run_agentd, run_store, tmp_path):
    store = run_store()
    out, stop = tmp_path / "job", tmp_path / "stop"
    out.mkdir()
    env = {"AGENTD_STORE_TOKEN": TOKEN, "TEST_AGENTD_COMPUTE": "0.02"}
    job = ["--health-port", "0", "--straggler-interval", "0.5", TRAIN, str(out), str(stop)]
    rdzv = agent_args(store.endpoint, "2:2", conf=STEADY_MEMBER)  # a lapse fails 2:2
    agents = [run_agentd(*rdzv, *job, env=env) for _ in range(2)]
    url = wait_until(
        lambda: re.search(r"Health endpoint on (http://\S+)", agents[0].stderr()),
        30,
        what="the health endpoint",
    ).group(1)

    def scrape() -> str | None:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as answer:
            text = answer.read().decode()
        return text if "agentd_node_compute_ratio{" in text else None

    text = wait_until(scrape, 60, what="the job-wide comparison's first verdict")
    exported = {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ("",))
    }
    for query in dashboard_queries() + rule_queries():
        assert named_metrics(query) and named_metrics(query) <= exported, (query, exported)
    stop.touch()
    for agent in agents:
        assert agent.wait(30) == 0, agent.stderr()[-3000:]
