"""recovery_worker.py's job, in a script that takes Hugging Face's ``Trainer`` after torch,
as a Trainer script does (``bench_recovery.py --library transformers``): ``--preload
auto`` then preloads transformers and looks its ``Trainer`` up in the zygote, and each
worker started anew imports them (3-4 s of CPU on 2 cores) unless it is forked."""

import runpy
from pathlib import Path

import torch  # noqa: F401
from transformers import Trainer, TrainingArguments  # noqa: F401

runpy.run_path(str(Path(__file__).with_name("recovery_worker.py")), run_name="__main__")
