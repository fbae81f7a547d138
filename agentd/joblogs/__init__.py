"""The job's logs: every node's worker output, merged in time order (``agentd logs``).

Each agent serves its own log files, read from its run directory, at ``GET /logs`` of its
health endpoint (``reader``), guarded by its token; the command asks any agent for the
round's nodes (``/job``), then each node for its lines, and merges them (``cli``).
"""
