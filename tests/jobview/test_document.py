"""The job view's arithmetic and text, on records made by hand."""

from __future__ import annotations

import random
import statistics

import pytest

from agentd.jobview.document import job_document
from agentd.jobview.record import StepRate
from agentd.jobview.table import render_job
from agentd.support.medians import median_of_others

HEADER = {"run_id": "r", "generation": 4, "world_size": 6, "size": 3, "min_nodes": 2}
HEADER |= {"max_nodes": 4, "spares": 1, "store": {"serving": "10.0.0.1:29400", "term": 2}}


def record(host: str, ranks: list[int], compute: float | None, **extra) -> dict:
    base = {"node": f"n-{host}", "host": host, "state": "HEALTHY", "ranks": ranks}
    base |= {"attempt": 1, "restarts": 1, "max_restarts": 3, "steps": 120, "step_rate": 9.5}
    base |= {"step_time": 0.1, "compute": compute, "last_failure": None, "drain": None}
    return {**base, "at": 1000.0, **extra}


@pytest.mark.parametrize("size", [2, 3, 4, 7, 10])
def test_the_median_of_the_others_is_the_median_without_that_entry(size):
    rng = random.Random(size)
    values = sorted(rng.choice([0.5, 1.0, 1.0, 2.0, rng.random()]) for _ in range(size))
    for i, value in enumerate(values):
        others = values[:i] + values[i + 1 :]
        assert median_of_others(values, value) == pytest.approx(statistics.median(others))
    assert median_of_others([3.0], 3.0) is None


def test_rows_by_group_rank_with_ratios_ages_and_a_missing_record():
    records = {0: record("a", [0, 1], 0.02), 2: record("c", [4, 5], 0.04, at=997.5)}
    doc = job_document(HEADER, records, 3, now=1000.0)
    rows = doc["nodes"]
    assert [r["group_rank"] for r in rows] == [0, 1, 2]
    assert (rows[1]["state"], rows[1]["ranks"], rows[1]["record_age"]) == ("UNKNOWN", [], None)
    assert (rows[0]["ratio"], rows[2]["ratio"], rows[1]["ratio"]) == (0.5, 2.0, None)
    assert (rows[0]["record_age"], rows[2]["record_age"]) == (0.0, 2.5)
    assert doc["spares"] == 1 and doc["store"]["term"] == 2


def test_the_step_time_compares_nodes_where_no_sections_are_timed():
    records = {
        i: record(h, [i], None, step_time=t)
        for i, (h, t) in enumerate(["a", "b"] and [("a", 0.1), ("b", 0.3)])
    }
    rows = job_document(HEADER, records, 2, now=1000.0)["nodes"]
    assert [r["ratio"] for r in rows] == [pytest.approx(1 / 3, abs=1e-3), 3.0]


def test_the_table_marks_the_slow_node_and_names_failures_and_drains():
    failure = {"rank": 3, "exitcode": -9, "signal": "SIGKILL", "at": 990.0}
    records = {
        0: record("a", [0, 1], 0.02),
        1: record("b", [2, 3], 0.02, last_failure=failure, drain="straggler: 2.00x"),
        2: record("c", [4, 5, 7], 0.05),
    }
    lines = render_job(job_document(HEADER, records, 3, now=1001.0)).splitlines()
    assert lines[0] == (
        "run r  round 4  world size 6  nodes 3 (2:4)  spares waiting 1  store 10.0.0.1:29400 term 2"
    )
    row = ["1", "b", "HEALTHY", "2-3", "1", "1/3", "120", "9.5", "0.57", "1s"]
    assert lines[4].split()[:10] == row
    assert "draining: straggler: 2.00x; rank 3 SIGKILL at " in lines[4]
    assert lines[5].split()[3] == "4-5,7" and "2.50! " in lines[5]
    assert "!" not in lines[3]
    excluded = {**HEADER, "excluded": {"n-d": "gpu-check: exit 1"}}
    last = render_job(job_document(excluded, records, 3, now=1001.0)).splitlines()[-1]
    assert last == "   - n-d: excluded by its node checks (gpu-check: exit 1)"


def test_the_step_rate_is_known_from_the_second_reading_and_not_across_a_restart():
    rate = StepRate()
    assert rate.reading(10, 100.0) is None
    assert rate.reading(30, 102.0) == 10.0
    assert rate.reading(5, 103.0) is None  # the workers restarted: the count went back
    assert rate.reading(None, 104.0) is None and rate.reading(9, 105.0) is None
