"""``--preload auto`` reads the script's imports: what it preloads, and when it spawns."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from agentd.preload.auto import choose

HAS_NUMPY = importlib.util.find_spec("numpy") is not None
HAS_TORCH = importlib.util.find_spec("torch") is not None
HAS_LIGHTNING = importlib.util.find_spec("lightning") is not None


def script(tmp_path: Path, source: str, name: str = "train.py") -> str:
    path = tmp_path / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(source))
    return str(path)


@pytest.mark.skipif(not HAS_NUMPY, reason="needs numpy")
@pytest.mark.parametrize(
    "source",
    [
        "import numpy as np\n",
        "from numpy import random\n",
        "import numpy.linalg\n",
        "try:\n    import numpy\nexcept ImportError:\n    numpy = None\n",
        "import os\nif __name__ == '__main__':\n    import numpy\n",
        "import numpy\nimport os\nos.environ['X'] = '1'\n",  # after the import: harmless
        '"""Doc."""\nfrom __future__ import annotations\nimport math, typing\nimport numpy\n',
        "import os as _os\nSTEPS = 10\nNAME: str = 'x'\ndef f(a=1):\n    pass\nimport numpy\n",
    ],
)
def test_a_safe_library_imported_at_module_level_is_preloaded(tmp_path, source):
    chosen = choose("script", script(tmp_path, source), str(tmp_path))
    assert chosen.modules == ("numpy",)
    assert chosen.reason == "train.py imports numpy"


@pytest.mark.skipif(not (HAS_NUMPY and HAS_TORCH), reason="needs torch and numpy")
def test_torch_comes_first_whatever_the_order(tmp_path):
    chosen = choose("script", script(tmp_path, "import numpy\nimport torch.nn\n"), str(tmp_path))
    assert chosen.modules == ("torch", "numpy")


@pytest.mark.skipif(not HAS_NUMPY, reason="needs numpy")
def test_agentds_own_imports_keep_the_fork_in_the_order_a_formatter_sorts_them(tmp_path):
    """``import agentd`` (for ``agentd.heartbeat()``) sorts before ``import numpy`` or
    ``import torch``: it used to make auto spawn the workers of the scripts it serves."""
    source = "import agentd\nfrom agentd.integrations.lightning import HeartbeatCallback\n"
    chosen = choose("script", script(tmp_path, source + "import numpy\n"), str(tmp_path))
    assert chosen.modules == ("numpy",)


def test_agentds_worker_side_leaves_the_process_as_it_found_it():
    """What makes ``agentd`` inert for auto: importing its worker-side modules changes no
    environment variable, path entry, signal handler or thread (each opens its channel to
    the agent at first use)."""
    code = textwrap.dedent(
        """\
        import os, signal, sys, threading
        def state():
            handlers = {s: signal.getsignal(s) for s in signal.valid_signals()
                        if s not in (signal.SIGKILL, signal.SIGSTOP)}
            return dict(os.environ), list(sys.path), handlers, threading.active_count()
        before = state()
        import agentd, agentd.heartbeats.client, agentd.drain.client, agentd.errors.record
        agentd.heartbeat, agentd.section, agentd.record
        print(state() == before)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout == "True\n", done.stderr


@pytest.mark.skipif(not HAS_NUMPY, reason="needs numpy")
@pytest.mark.parametrize(
    ("source", "after"),
    [
        ("import numpy\nnumpy.seterr(all='ignore')\nimport torch\n", "train.py:2 runs `numpy"),
        (
            "import os\nimport numpy\nos.environ['TORCH_LOGS'] = '+dynamo'\nimport lightning\n",
            "train.py:3 changes the environment",
        ),
        ("import numpy\nfrom model import Net\nimport torch\n", "model.py:3 runs `seed()`"),
    ],
)
def test_a_library_imported_after_the_process_may_have_changed_is_not_preloaded(
    tmp_path, source, after
):
    """The worker imports it in a process the script changed (its environment, a seed, a
    setting): the zygote's import would not have seen that. Those before are preloaded."""
    script(tmp_path, "import random\nseed = random.seed\nseed()\n", "model.py")
    chosen = choose("script", script(tmp_path, source), str(tmp_path))
    assert chosen.modules == ("numpy",)
    later = "torch" if "torch" in source else "lightning"
    assert chosen.reason.startswith(f"train.py imports numpy; {later} only after {after}")


@pytest.mark.skipif(not (HAS_LIGHTNING and HAS_TORCH), reason="needs torch and lightning")
@pytest.mark.parametrize(
    ("source", "modules"),
    [
        ("import lightning as L\nimport torch\n", ("torch", "lightning")),
        ("import os\nfrom lightning.pytorch import Trainer\n", ("lightning",)),
    ],
)
def test_lightning_is_preloaded_after_torch(tmp_path, source, modules):
    """Its import reads the rank, which each forked worker derives again from its own."""
    chosen = choose("script", script(tmp_path, source), str(tmp_path))
    assert chosen.modules == modules


@pytest.mark.parametrize(
    "source",
    [
        "import json\n",
        "def main():\n    import numpy\n",
        "class A:\n    import numpy\n",
        "from . import numpy\n",
        "import os\nos.environ['A'] = '1'\nimport json\n",  # runs in the worker, after the fork
    ],
)
def test_a_script_that_imports_no_library_is_forked_from_a_bare_zygote(tmp_path, source):
    chosen = choose("script", script(tmp_path, source), str(tmp_path))
    assert chosen.modules == ()
    assert chosen.reason == "train.py imports none of torch, numpy, Lightning, transformers"


@pytest.mark.parametrize(
    ("source", "why"),
    [
        (
            "import os\nos.environ['CUDA_VISIBLE_DEVICES'] = '1'\nimport numpy\n",
            "train.py:2 changes the environment before it imports numpy",
        ),
        (
            "import os\nos.environ.setdefault('OMP_NUM_THREADS', '4')\nimport numpy\n",
            "train.py:2 changes the environment",
        ),
        ("import os\nos.putenv('A', 'b')\nimport numpy\n", "train.py:2 changes the environment"),
        (
            "from os import environ\nenviron.update(A='b')\nimport numpy\n",
            "train.py:2 changes the environment",
        ),
        (
            "from dotenv import load_dotenv\nload_dotenv()\nimport numpy\n",
            "train.py:1 imports dotenv (not known to leave the process unchanged) before",
        ),
        (
            "import os\nprint(os.environ.get('RANK'))\nimport numpy\n",
            "train.py:2 runs `print(os.environ.get('RANK'))` before it imports numpy",
        ),
        (
            "import os\nif True:\n    del os.environ['A']\nimport numpy\n",
            "train.py:3 changes the environment",
        ),
        (
            "import sys\nsys.path.insert(0, 'vendor')\nimport numpy\n",
            "train.py:2 changes sys.path before it imports numpy",
        ),
        ("import sys\nsys.path = ['x']\nimport numpy\n", "train.py:2 changes sys.path"),
        ("import numpy(\n", "cannot read train.py: SyntaxError"),
    ],
)
def test_spawns_and_says_why(tmp_path, source, why):
    chosen = choose("script", script(tmp_path, source), str(tmp_path))
    assert chosen.modules is None
    assert why in chosen.reason


def test_a_missing_script_spawns(tmp_path):
    chosen = choose("script", str(tmp_path / "nope.py"), str(tmp_path))
    assert chosen.modules is None and "cannot read nope.py" in chosen.reason


def test_the_users_own_module_of_that_name_is_never_preloaded(tmp_path):
    (tmp_path / "numpy.py").write_text("X = 1\n")
    chosen = choose("script", script(tmp_path, "import numpy\n"), str(tmp_path))
    assert chosen.modules is None
    assert chosen.reason == "train.py's folder has its own 'numpy', not the library"


def test_a_library_not_installed_spawns(tmp_path, monkeypatch):
    monkeypatch.setattr("agentd.preload.auto.SAFE", ("torch", "numpy", "no_such_lib_agentd"))
    chosen = choose("script", script(tmp_path, "import no_such_lib_agentd\n"), str(tmp_path))
    assert chosen.modules is None and "no_such_lib_agentd is not installed" in chosen.reason


@pytest.mark.skipif(not HAS_NUMPY, reason="needs numpy")
def test_a_module_entrypoint_is_read_from_its_file_without_importing_it(tmp_path):
    pkg = tmp_path / "proj"
    pkg.mkdir()
    (pkg / "__init__.py").write_text('"""The project."""\n')
    (pkg / "train.py").write_text("import numpy\n")
    (pkg / "__main__.py").write_text("import os\nos.environ['A'] = '1'\nimport numpy\n")
    assert choose("module", "proj.train", str(tmp_path)).modules == ("numpy",)
    assert "proj" not in sys.modules  # read, never imported
    package = choose("module", "proj", str(tmp_path))
    assert package.modules is None and "-m proj:2 changes the environment" in package.reason
    missing = choose("module", "proj.nothing", str(tmp_path))
    assert missing.modules is None and missing.reason == "-m proj.nothing: source not found"


def job(tmp_path: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        script(tmp_path, text, name)


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
@pytest.mark.parametrize(
    ("files", "why"),
    [
        (  # the environment set in a helper called before the import
            {
                "train.py": "import os\n\n\ndef setup():\n    os.environ['NCCL_DEBUG'] = 'INFO'"
                "\n\n\nsetup()\nimport torch\n"
            },
            "train.py:8 runs `setup()` before it imports torch",
        ),
        (  # a sibling module, imported first, sets OMP_NUM_THREADS
            {
                "settings.py": "import os\nos.environ['OMP_NUM_THREADS'] = '4'\n",
                "train.py": "import settings\nimport torch\n",
            },
            "settings.py:2 changes the environment before it imports torch",
        ),
        (
            {"train.py": "from os import environ as env\nenv['X'] = '1'\nimport torch\n"},
            "train.py:2 changes the environment before it imports torch",  # through the alias
        ),
        (  # another torch build, silently
            {
                "train.py": "import sys as _s\n_s.path.insert(0, '/opt/vendored-torch')\n"
                "import torch\n"
            },
            "train.py:2 changes sys.path before it imports torch",
        ),
        (
            {"train.py": "import site\nsite.addsitedir('/opt/libs')\nimport torch\n"},
            "train.py:1 imports site (not known to leave the process unchanged)",
        ),
        (
            {"train.py": "exec(open('env.py').read())\nimport torch\n"},
            "train.py:1 runs `exec(open('env.py').read())` before it imports torch",
        ),
        (
            {"train.py": "import wandb\nimport torch\n"},
            "train.py:1 imports wandb (not known to leave the process unchanged) before it "
            "imports torch",
        ),
        (
            {"train.py": "import logging\nlog = logging.getLogger('x')\nimport torch\n"},
            "train.py:2 runs `log = logging.getLogger('x')` before it imports torch",
        ),
    ],
)
def test_anything_that_may_change_the_process_before_the_import_spawns(tmp_path, files, why):
    job(tmp_path, files)
    chosen = choose("script", str(tmp_path / "train.py"), str(tmp_path))
    assert chosen.modules is None
    assert chosen.reason == why or chosen.reason.startswith(why), chosen.reason


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_a_package_init_is_read_before_the_module_it_runs(tmp_path):
    job(
        tmp_path,
        {
            "pkg/__init__.py": "import os\nos.environ['X'] = '1'\n",
            "pkg/train.py": "import torch\n",
        },
    )
    chosen = choose("module", "pkg.train", str(tmp_path))
    assert chosen.modules is None
    assert chosen.reason == "pkg/__init__.py:2 changes the environment before it imports torch"


@pytest.mark.skipif(not HAS_TORCH, reason="needs torch")
def test_the_jobs_own_clean_modules_keep_the_fork(tmp_path):
    """``from model import Net`` before ``import torch`` forks when model.py is clean
    (here it reaches torch itself, after a docstring and constants)."""
    job(
        tmp_path,
        {
            "model.py": '"""The net."""\nSIZE = 4\nimport torch\n\n\nclass Net(torch.nn.Module):\n'
            "    pass\n",
            "helpers/__init__.py": "",
            "helpers/paths.py": "import os\nROOT = '/data'\n",
            "train.py": "from helpers import paths\nfrom model import Net\nimport torch\n",
        },
    )
    chosen = choose("script", str(tmp_path / "train.py"), str(tmp_path))
    assert chosen.modules is not None and chosen.modules[0] == "torch", chosen.reason
    job(tmp_path, {"helpers/paths.py": "import os\nos.makedirs('/tmp/x', exist_ok=True)\n"})
    dirty = choose("script", str(tmp_path / "train.py"), str(tmp_path))
    assert dirty.reason.startswith("helpers/paths.py:2 runs `os.makedirs(")


@pytest.mark.skipif(not HAS_NUMPY, reason="needs numpy")
def test_a_directory_is_read_by_its_main_with_itself_on_the_path(tmp_path):
    """``python app/`` runs ``app/__main__.py`` with ``app`` as ``sys.path[0]``: a module of
    the library's name there is the user's (it read as an unreadable script: spawn)."""
    app = tmp_path / "app"
    script(app, "import numpy\n", "__main__.py")
    chosen = choose("script", "app", str(tmp_path))
    assert (chosen.modules, chosen.reason) == (("numpy",), "app imports numpy")
    (app / "numpy.py").write_text("X = 1\n")
    chosen = choose("script", "app/", str(tmp_path))
    assert chosen.modules is None
    assert chosen.reason == "app's folder has its own 'numpy', not the library"


def test_a_zip_application_spawns_and_says_so(tmp_path):
    import zipapp

    script(tmp_path / "app", "import numpy\n", "__main__.py")
    zipapp.create_archive(tmp_path / "app", tmp_path / "app.pyz")
    chosen = choose("script", "app.pyz", str(tmp_path))
    assert chosen.modules is None
    assert chosen.reason == "app.pyz is a zip application (its imports not read)"
