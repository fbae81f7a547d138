"""The job at a glance: each agent's status record in the store (``record``,
``publisher``), and any agent's view of every member of its round from those records
(``document``, served as ``/job`` and drawn by ``agentd status --job``)."""
