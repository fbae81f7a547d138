"""A Hugging Face Trainer job with agentd's callback: steps, evaluation, checkpoints.

``hf_trainer.py OUT [STEPS [SAVE_STEPS]]``: 400 steps unless STEPS says otherwise (a drain
test asks for more than it lets the job reach: 400 steps take about 1.3 s on a quiet
machine), a checkpoint every 200 unless SAVE_STEPS says otherwise.
Run under ``agentd run`` by tests/integration/test_hangs.py and tests/drain.
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
        max_steps=int(sys.argv[2]) if len(sys.argv) > 2 else 400,
        per_device_train_batch_size=8,
        eval_strategy="steps",
        eval_steps=100,
        save_strategy="steps",
        save_steps=int(sys.argv[3]) if len(sys.argv) > 3 else 200,
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
