"""Reading a worker's command line for the zygote, and the --preload setting."""

from __future__ import annotations

import sys

import pytest

from agentd.config.resolve import resolve
from agentd.exceptions import ConfigError
from agentd.preload.command import parse
from agentd.spec import WorkerSpec


def test_script_with_interpreter_options():
    cmd = parse([sys.executable, "-u", "-W", "error", "-Xdev", "train.py", "--lr", "-1"])
    assert cmd.options == ("-u", "-W", "error", "-X", "dev") and cmd.kind == "script"
    assert (cmd.target, cmd.args) == ("train.py", ("--lr", "-1"))


def test_module_and_path0(tmp_path):
    cmd = parse([sys.executable, "-u", "-m", "pkg.train", "x"])
    assert (cmd.kind, cmd.target, cmd.args) == ("module", "pkg.train", ("x",))
    assert cmd.path0(str(tmp_path)) == str(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "train.py").write_text("")
    (tmp_path / "link.py").symlink_to(tmp_path / "real" / "train.py")
    assert parse(["python3", "link.py"]).path0(str(tmp_path)) == str(tmp_path / "real")


@pytest.mark.parametrize(
    "argv, words",
    [
        (["/bin/true"], "must be Python"),
        ([sys.executable, "-c", "pass"], "no -c"),
        ([sys.executable, "-"], "no -c, no stdin"),
        ([sys.executable, "-u"], "cannot run"),
    ],
)
def test_what_a_zygote_cannot_run_is_named(argv, words):
    with pytest.raises(ConfigError, match=words):
        parse(argv)


def _config(**cli):
    return resolve({"script": "train.py", **cli}, {}, None)


@pytest.mark.parametrize(
    "text, expected",
    [("off", None), ("torch", ("torch",)), ("torch, numpy ,", ("torch", "numpy")), ("", ())],
)
def test_preload_values(text, expected):
    assert _config(preload=text).preload == expected


def test_preload_from_the_environment_and_its_errors():
    assert resolve({"script": "t.py"}, {"AGENTD_PRELOAD": "torch"}, None).preload == ("torch",)
    off = resolve({"script": "t.py", "preload": "off"}, {"AGENTD_PRELOAD": "torch"}, None)
    assert off.preload is None
    with pytest.raises(ConfigError, match=r"--preload: 'a-b' names 'a-b', which is not"):
        _config(preload="a-b")
    with pytest.raises(ConfigError, match="--preload: needs a Python script"):
        _config(preload="torch", no_python=True)


def test_worker_spec_checks_preload_names():
    with pytest.raises(ConfigError, match=r"preload: '1torch' is not a module name"):
        WorkerSpec(role="r", local_world_size=1, entrypoint="python", preload=("1torch",))
    with pytest.raises(ConfigError, match="must be a list of module names"):
        WorkerSpec(role="r", local_world_size=1, entrypoint="python", preload="torch")  # type: ignore[arg-type]
