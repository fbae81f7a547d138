"""A Lightning DDP job on CPU with agentd's callback: training, validation, checkpoints.

``lightning_ddp.py ROOT [EPOCHS]``: 2 epochs unless EPOCHS says otherwise (a drain test
asks for more than it lets the job reach). Run by tests/integration/test_hangs.py and
tests/drain under ``agentd run --nproc-per-node 2``.
"""

import os
import sys

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset

from agentd.integrations.lightning import HeartbeatCallback


class Line(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def main() -> None:
    torch.manual_seed(0)
    x = torch.randn(1024, 2)
    data = TensorDataset(x, x @ torch.tensor([[2.0], [-3.0]]))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        strategy="ddp",
        max_epochs=int(sys.argv[2]) if len(sys.argv) > 2 else 2,
        default_root_dir=sys.argv[1],
        callbacks=[HeartbeatCallback()],
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer.fit(Line(), DataLoader(data, batch_size=8), DataLoader(data, batch_size=32))
    print(f"trained {os.environ['RANK']}", flush=True)
    # Lightning leaves the gloo group up; a rank that exits while its peer still tears the
    # group down can abort that peer ("terminate called without an active exception"),
    # under torchrun as under agentd, and more likely on a loaded machine.
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
