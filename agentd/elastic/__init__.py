"""torch.distributed.elastic's module paths, over agentd.

Code written against ``torch.distributed.elastic`` runs on agentd when that import prefix
becomes ``agentd.elastic`` (and ``torch.distributed.launcher.api`` becomes
``agentd.launcher``). These modules only re-export agentd's names; the flat ``agentd``
API is the primary one. The mapping is in the README.
"""
