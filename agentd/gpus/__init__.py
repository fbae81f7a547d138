"""The node's GPUs as the agent sees them: which processes hold memory on them
(:mod:`agentd.gpus.usage`), and the wait after a stop until the stopped workers' memory
is released (:mod:`agentd.gpus.release`). NVML or nvidia-smi is looked for once the first
workers run, in a thread; the launch does not wait for it, and a node with neither
NVIDIA's driver device nor ``nvidia-smi`` loads neither."""

from __future__ import annotations

import os

DRIVER_DEVICE = "/dev/nvidiactl"
"""Present wherever NVIDIA's driver is loaded (and in a container given its GPUs)."""


def nvidia_smi() -> str | None:
    """``nvidia-smi``'s path on PATH, found as ``shutil.which`` would (which a launch does
    not import: it loads the compression modules)."""
    for folder in os.environ.get("PATH", os.defpath).split(os.pathsep):
        path = os.path.join(folder or ".", "nvidia-smi")
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def may_have_gpus() -> bool:
    """Whether the GPUs are worth looking for: the driver's device, or ``nvidia-smi``."""
    return os.path.exists(DRIVER_DEVICE) or nvidia_smi() is not None
