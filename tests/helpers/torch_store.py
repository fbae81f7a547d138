"""torch's own TCPStore server, the reference the agent's store and client are tested against."""

from __future__ import annotations

from datetime import timedelta
from typing import Any


def torch_master_store() -> Any:
    """A torch TCPStore server on a free port of 127.0.0.1 (its ``port`` says which); it
    stops when the object is freed. Needs torch (callers skip without it)."""
    import torch.distributed as dist

    return dist.TCPStore(
        "127.0.0.1",
        0,
        world_size=None,
        is_master=True,
        timeout=timedelta(seconds=10),
        wait_for_workers=False,
    )
