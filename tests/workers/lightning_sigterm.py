"""A Lightning DDP job stopped while its ranks are apart: ``lightning_sigterm.py OUT``.

From the fourth batch on, rank 0 waits in an all-reduce (native code: its Python signal
handlers wait for it to return) while rank 1 sleeps 2 s before it joins; each writes
``OUT/<rank>`` first, so a test can send the stop then. Run by
tests/drain/test_integrations.py under ``agentd run --nproc-per-node 2``.
"""

import os
import sys
import time

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

from agentd.integrations.lightning import HeartbeatCallback

out = sys.argv[1]


class Apart(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        if batch_idx >= 3:
            open(os.path.join(out, str(self.global_rank)), "w").close()
            if self.global_rank == 1:
                time.sleep(2.0)
        flag = torch.ones(1, dtype=torch.int64)
        dist.all_reduce(flag)
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(4096, 2)
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_epochs=1,
        callbacks=[HeartbeatCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        logger=False,
    )
    data = TensorDataset(x, x @ torch.tensor([[2.0], [-3.0]]))
    trainer.fit(Apart(), DataLoader(data, batch_size=8))


if __name__ == "__main__":
    main()
