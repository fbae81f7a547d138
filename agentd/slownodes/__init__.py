"""Job-wide stragglers: every node's compute times compared across the job, a node that
stays slow named on every agent, and swapped for a waiting spare when asked
(``--replace-stragglers``)."""
