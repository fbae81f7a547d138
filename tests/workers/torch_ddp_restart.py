"""examples/train.py's job with a forced restart: rank 1 crashes at step 5 of attempt 0.

Prints whether torch was already imported when the script began (a preloaded zygote)."""

import sys

PRELOADED = "torch" in sys.modules

import gc  # noqa: E402
import os  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

restart = os.environ["TORCHELASTIC_RESTART_COUNT"]
dist.init_process_group("gloo")
rank = dist.get_rank()
if rank == 0:
    print(f"preloaded torch: {PRELOADED} (restart {restart})", flush=True)
torch.manual_seed(0)
true_w = torch.tensor([[2.0], [-3.0]])
model = DistributedDataParallel(torch.nn.Linear(2, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
generator = torch.Generator().manual_seed(rank)
for step in range(50):
    if restart == "0" and rank == 1 and step == 5:
        os._exit(1)
    x = torch.randn(64, 2, generator=generator)
    loss = torch.nn.functional.mse_loss(model(x), x @ true_w + 0.5)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
if rank == 0:
    weight = model.module.weight.detach().flatten().tolist()
    print(f"learned weight {[round(w, 2) for w in weight]} (restart {restart})", flush=True)
dist.barrier()
del model, optimizer  # as examples/train.py: gloo's work freed before the interpreter's exit
gc.collect()
dist.destroy_process_group()
