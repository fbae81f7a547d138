"""The node's GPUs as the agent sees them: which processes hold memory on them
(:mod:`agentd.gpus.usage`), and the wait after a stop until the stopped workers' memory
is released (:mod:`agentd.gpus.release`). NVML or nvidia-smi is looked for once the first
workers run, in a thread; the launch does not wait for it."""
