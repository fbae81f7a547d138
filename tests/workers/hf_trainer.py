"""A Hugging Face Trainer job with agentd's callback: steps, evaluation, checkpoints.

Run by tests/integration/test_hangs.py under ``agentd run``.
"""

import sys

import torch
from torch.utils.data import Dataset
from transformers import Trainer, TrainingArguments

from agentd.integrations.transformers import HeartbeatCallback


class Points(Dataset):
    def __init__(self, n: int) -> None:
        torch.manual_seed(0)
        self.x = torch.randn(n, 2)
        self.y = self.x @ torch.tensor([2.0, -3.0])

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"x": self.x[i], "labels": self.y[i]}


class Line(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
        out = self.layer(x).squeeze(-1)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def main() -> None:
    args = TrainingArguments(
        output_dir=sys.argv[1],
        max_steps=400,
        per_device_train_batch_size=8,
        eval_strategy="steps",
        eval_steps=100,
        save_strategy="steps",
        save_steps=200,
        logging_strategy="no",
        report_to=[],
        use_cpu=True,
        learning_rate=0.05,
    )
    trainer = Trainer(
        model=Line(),
        args=args,
        train_dataset=Points(4096),
        eval_dataset=Points(512),
        callbacks=[HeartbeatCallback()],
    )
    trainer.train()
    print("trained", flush=True)


if __name__ == "__main__":
    main()
