"""Health-gated membership: a host that fails its checks takes itself out of the job.

``--node-check`` names the checks (:mod:`agentd.nodecheck.checks`); the gate
(:mod:`agentd.nodecheck.gate`) runs them before every rendezvous join and, while the
workers run, every ``--node-check-interval`` seconds. A failing host leaves the job (the
others re-form without it, no restart spent), publishes why in the store, waits a cooldown
that doubles with each exclusion, and joins again once its checks pass.
"""
