"""Coordinated drain: every rank of the job checkpoints at the same step before the world
changes, then the job re-forms without the draining node (no restart spent).

The worker side is :mod:`agentd.drain.client` (``checkpoint_requested()``, a callback,
``checkpoint_saved()``); the agents agree on the step through the rendezvous store
(:mod:`agentd.drain.protocol`); :mod:`agentd.drain.service` runs it in each agent.
"""
