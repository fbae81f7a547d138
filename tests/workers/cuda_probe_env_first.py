"""``cuda_probe.py``'s check for a script that hides the GPUs *before* importing torch:
``--preload auto`` must spawn it (the start line says why), and it sees no device."""

import os
import runpy
import sys

os.environ["CUDA_VISIBLE_DEVICES"] = ""
import torch  # noqa: F401  (after the variable: what the check is about)

sys.argv = [os.path.join(os.path.dirname(__file__), "cuda_probe.py"), *sys.argv[1:]]
runpy.run_path(sys.argv[0], run_name="__main__")
