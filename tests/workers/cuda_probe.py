"""What CUDA a worker sees: ``cuda_probe.py OUT [hide]``. Imports torch, then (with
``hide``) sets ``CUDA_VISIBLE_DEVICES`` to nothing before CUDA starts, as a script may;
writes ``probe_<RANK>.json``: the devices torch counts, the variable, and whether a tensor
could be made on the GPU. Run forked from a zygote (the default) and spawned, it must
report the same."""

import json
import os
import sys

import torch

out = sys.argv[1]
if sys.argv[2:] == ["hide"]:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
report = {
    "count": torch.cuda.device_count(),
    "visible": os.environ.get("CUDA_VISIBLE_DEVICES"),
    "local_rank": os.environ["LOCAL_RANK"],
}
if report["count"]:
    report["sum"] = float(torch.ones(4, device="cuda").sum().item())
with open(os.path.join(out, f"probe_{os.environ['RANK']}.json"), "w") as fp:
    json.dump(report, fp)
