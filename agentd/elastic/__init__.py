"""torch.distributed.elastic's module paths, over agentd.

Code written against ``torch.distributed.elastic`` runs on agentd when that import prefix
becomes ``agentd.elastic`` (and ``torch.distributed.launcher.api`` becomes
``agentd.launcher``). Most modules here re-export agentd's names; three *are* agentd's
modules (``agent.server.api`` the agent template, ``metrics.api`` the metrics API,
``rendezvous.registry`` the registry), so that what torch's users patch there is what
agentd calls; ``events`` and ``multiprocessing.api`` add torch's small adapters. The
mapping and the measured parity are in docs/python-api.md.
"""
