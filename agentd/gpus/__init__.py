"""The node's GPUs as the agent sees them: which processes hold memory on them
(:mod:`agentd.gpus.usage`), and the wait after a stop until the stopped workers' memory
is released (:mod:`agentd.gpus.release`). Nothing here loads unless a stop needs it."""
