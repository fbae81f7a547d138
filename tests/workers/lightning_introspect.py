"""What a Lightning worker derived from its process at import, as JSON in
``$TEST_AGENTD_OUT/lightning_<RANK>.json``: the rank Lightning's ``rank_zero_only`` took,
and whether its loggers' stream handlers write through this worker's own ``sys.stderr``.
It also says a line through ``rank_zero_info`` before any Trainer exists (Lightning's
handler writes it on rank 0 alone). Its first import beyond the standard library is
Lightning, as a Lightning script's is: ``--preload auto`` forks it from a zygote that
preloaded Lightning.
"""

import json
import logging
import os
import sys

import lightning
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_only

rank_zero_info(f"said on rank zero (RANK {os.environ['RANK']})")
handlers = [
    handler
    for name in ("lightning.pytorch", "lightning.fabric")
    for handler in logging.getLogger(name).handlers
    if isinstance(handler, logging.StreamHandler)
]
report = {
    "RANK": int(os.environ["RANK"]),
    "rank_zero_only": rank_zero_only.rank,
    "handlers": len(handlers),
    "handlers_on_own_stderr": all(handler.stream is sys.stderr for handler in handlers),
    "version": lightning.__version__,
}
with open(
    os.path.join(os.environ["TEST_AGENTD_OUT"], f"lightning_{report['RANK']}.json"), "w"
) as fp:
    json.dump(report, fp)
