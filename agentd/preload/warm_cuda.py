"""In a standby worker started with ``--standby-cuda``: CUDA's start-up, done while it
waits rather than on a restart's path.

A process that will use a GPU pays, at its first CUDA call, for the driver's
initialisation (``cuInit``) and for a context on its device (measured in a forked child:
124-253 ms and 123-140 ms on an H200). A standby does both ahead, under the environment
the zygote has (the workers' own variables, ``CUDA_VISIBLE_DEVICES`` included, are the
same but for their ranks), on the device its slot's local rank uses by torch's
convention, ``cuda:LOCAL_RANK`` (modulo the devices visible). The zygote itself never
touches CUDA: a process forked after CUDA started cannot use it, and every standby is a
leaf. The context holds device memory of its own (no allocation is made: the caching
allocator stays empty), which docs/inprocess.md gives with its figure.
"""

from __future__ import annotations

import sys


def warm_cuda(slot: int) -> int | None:
    """Initialise CUDA and make the primary context on device ``slot`` modulo the visible
    devices; return that device. None where torch is not preloaded or sees no GPU, and
    where the start-up fails (one line on stderr says why; the standby then waits without
    its CUDA made ready, and its worker's own first CUDA call meets what failed)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    try:
        if not torch.cuda.is_available():
            return None
        device = slot % torch.cuda.device_count()
        with torch.cuda.device(device):  # the current device is the default again after
            torch.cuda.synchronize()  # needs the device's context: it makes it
    except Exception as exc:
        sys.stderr.write(
            f"agentd: standby worker {slot}: CUDA could not be started ahead "
            f"({type(exc).__name__}: {exc}); its worker starts CUDA itself\n"
        )
        return None
    return device
