"""What a trivial standalone job imports of agentd: only the features it uses.

Counted over the whole run of ``agentd run --standalone --nproc-per-node 1`` of a script
that does nothing (``bench/import_cost.py`` prints the same count with the self import
time). The budget is issue 48's target, which the code reaches: a feature imported by a
job that does not use it fails here.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from import_cost import import_cost  # noqa: E402

BUDGET = 70

NOT_FOR_ONE_NODE = (
    "agentd.rendezvous.dynamic",
    "agentd.rendezvous.membership",
    "agentd.rendezvous.sealing",
    "agentd.rendezvous.roll_call",
    "agentd.rendezvous.release",
    "agentd.rendezvous.accounting",
    "agentd.slownodes.service",
    "agentd.slownodes.settings",
    "agentd.drain.service",
    "agentd.store.memory",
    "agentd.health.service",
    "agentd.inprocess.service",
    "agentd.inprocess.settings",
)
"""Machinery a job of one node never runs: rounds among peers, their leases and releases,
the job-wide straggler comparison; a drain's service and store, built when the node
drains; the health endpoint, which no option asked for; and in-process restarts, for a
group that is never restarted (``--max-restarts 0``, the default, on one node)."""


def test_a_standalone_job_imports_only_what_it_uses():
    cost = import_cost()
    imported = set(cost.modules)
    assert not imported & set(NOT_FOR_ONE_NODE), sorted(imported & set(NOT_FOR_ONE_NODE))
    assert len(cost.modules) <= BUDGET, (len(cost.modules), cost.modules)


def test_the_default_static_job_imports_no_dynamic_rendezvous():
    """Without ``--standalone`` (torchrun's default: static, one node) neither."""
    imported = set(import_cost(standalone=False).modules)
    assert "agentd.rendezvous.static" in imported
    assert not imported & set(NOT_FOR_ONE_NODE)
