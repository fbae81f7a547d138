"""Each private part of another library agentd relies on (agentd/support/compat/), checked
against the installed release: a failure names the library and its version, so an
upgrade that changed what agentd relies on is found here, not in a job."""

from __future__ import annotations

import ast
import asyncio
import inspect
import multiprocessing
import sys
from importlib.metadata import version
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from agentd.support.compat import aiohttp as compat_aiohttp
from agentd.support.compat.multiprocessing import inheriting, queue_reader_fd
from tests.conftest import installed

PACKAGE = Path(__file__).resolve().parents[2] / "agentd"
AIOHTTP = f"aiohttp {aiohttp.__version__}"
PYTHON = f"Python {sys.version.split()[0]}"


async def test_runner_class_serves_the_wrapped_server():
    wrapped: list[web.Server] = []

    def wrap(server: web.Server) -> web.Server:
        wrapped.append(server)
        return server

    async def hello(_request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", hello)
    runner = compat_aiohttp.runner_class(wrap)(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        async with (
            aiohttp.ClientSession() as session,
            session.get(f"http://127.0.0.1:{port}/") as response,
        ):
            assert await response.text() == "ok"
    finally:
        await runner.cleanup()
    assert len(wrapped) == 1, f"{AIOHTTP}: AppRunner._make_server is no longer called"


def test_a_request_handler_can_become_one_with_a_deferred_keepalive():
    from aiohttp.web_protocol import RequestHandler

    assert "_process_keepalive" in vars(RequestHandler), (
        f"{AIOHTTP}: RequestHandler._process_keepalive is gone"
    )
    source = inspect.getsource(RequestHandler)
    assert "self._process_keepalive" in source, (
        f"{AIOHTTP}: the idle-connection timer no longer calls _process_keepalive"
    )
    assert "__slots__" in vars(RequestHandler), f"{AIOHTTP}: RequestHandler has no slots"
    subclass = compat_aiohttp.keepalive_deferred(RequestHandler, 0.1)
    loop = asyncio.new_event_loop()
    try:
        server = web.Server(lambda _request: web.Response(), loop=loop)
        handler = server()
        compat_aiohttp.become(handler, subclass)
    finally:
        loop.close()
    assert type(handler) is subclass


def test_inheriting_is_what_multiprocessing_spawn_reads():
    from multiprocessing import process, spawn

    spawn._check_not_importing_main()  # outside: fine
    with inheriting():
        assert process.current_process()._inheriting is True
        with pytest.raises(RuntimeError):  # spawn's own check reads the flag
            spawn._check_not_importing_main()
    assert not hasattr(process.current_process(), "_inheriting"), PYTHON


def test_queue_reader_fd_is_the_queue_pipe():
    import select

    queue = multiprocessing.get_context("spawn").Queue()
    try:
        fd = queue_reader_fd(queue)
        queue.put("x")
        readable, _, _ = select.select([fd], [], [], 10)
        assert readable == [fd], f"{PYTHON}: a Queue's _reader is not the pipe it reads"
    finally:
        queue.close()
        queue.join_thread()
    with pytest.raises(TypeError, match="mp_queue"):
        queue_reader_fd(object())


def run_python(code: str) -> str:
    """Run ``code`` in a fresh interpreter (these parts end an interpreter's life); its
    stdout."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_run_module_as_main_runs_it_as_python_m(tmp_path):
    """In a fresh interpreter: the module runs in ``__main__``'s own namespace."""
    (tmp_path / "probe_main.py").write_text("import sys\nprint(__name__, sys.argv[0])\n")
    code = (
        "import sys\n"
        f"sys.path.insert(0, {str(tmp_path)!r})\n"
        "sys.argv = ['-m', 'arg']\n"
        "from agentd.support.compat.runpy import run_module_as_main\n"
        "run_module_as_main('probe_main')\n"
    )
    expected = f"__main__ {tmp_path / 'probe_main.py'}"
    assert run_python(code).strip() == expected, PYTHON


def test_join_non_daemon_threads_waits_for_them():
    code = (
        "import threading, time\n"
        "from agentd.support.compat.threading import join_non_daemon_threads\n"
        "threading.Thread(target=lambda: (time.sleep(0.2), print('thread'))).start()\n"
        "join_non_daemon_threads()\n"
        "print('joined', flush=True)\n"
    )
    assert run_python(code).split() == ["thread", "joined"], f"{PYTHON}: threading._shutdown"


def test_run_exit_functions_runs_and_clears_them():
    code = (
        "import atexit, os\n"
        "from agentd.support.compat.atexit import run_exit_functions\n"
        "atexit.register(print, 'exit function')\n"
        "run_exit_functions()\n"
        "run_exit_functions()\n"
        "print('done', flush=True)\n"
        "os._exit(0)\n"
    )
    assert run_python(code).splitlines() == ["exit function", "done"], f"{PYTHON}: atexit"


@pytest.mark.torch
def test_torch_process_groups_and_abort(tmp_path):
    """Run in a fresh process: a gloo world of one, one more group, then the abort."""
    torch = pytest.importorskip("torch")
    init = f"init_method='file://{tmp_path}/rdzv', rank=0, world_size=1"
    code = (
        "import torch.distributed as dist\n"
        "from agentd.support.compat.torch import (\n"
        "    abort_process_groups, group_backend, process_groups)\n"
        f"dist.init_process_group('gloo', {init})\n"
        "extra = dist.new_group([0])\n"
        "groups = process_groups(dist)\n"
        "assert groups[0] is dist.group.WORLD and extra in groups, groups\n"
        "import torch\n"
        "assert group_backend(extra, torch.device('cpu')) is not None\n"
        "abort_process_groups(dist)\n"
        "print('ok')\n"
    )
    assert run_python(code).strip() == "ok", f"torch {torch.__version__}"


@pytest.mark.torch
def test_torch_forgets_its_groups_and_a_new_world_starts_while_they_abort(tmp_path):
    """Run in a fresh process: the groups forgotten, torch names the next world's group
    "0" as a new process's, and the forgotten groups abort afterwards."""
    torch = pytest.importorskip("torch")
    init = f"init_method='file://{tmp_path}/rdzv', rank=0, world_size=1"
    code = (
        "import torch, torch.distributed as dist\n"
        "from agentd.support.compat.torch import abort_groups, forget_process_groups\n"
        f"dist.init_process_group('gloo', {init})\n"
        "extra = dist.new_group([0])\n"
        "doomed = forget_process_groups(dist)\n"
        "assert extra in doomed and len(doomed) == 2, doomed\n"
        "assert not dist.is_initialized()\n"
        "dist.init_process_group('gloo', store=dist.HashStore(), rank=0, world_size=1)\n"
        "assert dist.distributed_c10d._get_default_group().group_name == '0'\n"
        "abort_groups(doomed, None)\n"
        "tensor = torch.ones(2)\n"
        "dist.all_reduce(tensor)\n"
        "dist.destroy_process_group()\n"
        "print('ok')\n"
    )
    assert run_python(code).strip() == "ok", f"torch {torch.__version__}"


@pytest.mark.torch
def test_lightning_registers_the_sigterm_notifier_agentd_gives_its_trainer():
    """Run in a fresh process (Lightning's import is heavy): the notifier set on the
    connector is the one Lightning's registration composes for SIGTERM, and it sets the
    trainer's flag (what its training loop reads)."""
    installed("lightning")
    code = (
        "import signal\n"
        "import lightning as L\n"
        "from agentd.support.compat.lightning import sigterm_without_broadcast\n"
        "trainer = L.Trainer(accelerator='cpu', devices=1, logger=False)\n"
        "assert sigterm_without_broadcast(trainer)\n"
        "connector = trainer._signal_connector\n"
        "notify = connector._sigterm_notifier_fn\n"
        "connector.register_signal_handlers()\n"
        "assert notify in signal.getsignal(signal.SIGTERM).signal_handlers\n"
        "notify(signal.SIGTERM, None)\n"
        "assert trainer.received_sigterm\n"
        "print('ok')\n"
    )
    assert run_python(code).strip() == "ok", f"lightning {version('lightning')}"


@pytest.mark.torch
def test_torch_logs_specs_keep_their_settings_where_compat_reads_them(tmp_path):
    torch_mp = pytest.importorskip("torch.distributed.elastic.multiprocessing")
    from agentd.support.compat.torch import logs_specs_settings

    specs = torch_mp.DefaultLogsSpecs(
        log_dir=str(tmp_path),
        redirects=torch_mp.Std.ERR,
        tee={0: torch_mp.Std.OUT},
        local_ranks_filter={1},
    )
    torch = sys.modules["torch"]
    assert logs_specs_settings(specs) == (
        torch_mp.Std.ERR,
        {0: torch_mp.Std.OUT},
        {1},
    ), f"torch {torch.__version__}"


DOCUMENTED = (" os._exit", " sys._getframe")
"""Names with an underscore that their library documents as public API."""
ALLOWED_PRIVATE = ("_agentd",)
"""Attributes agentd sets on other objects itself (a marker on a wrapped function)."""


def private_uses(path: Path) -> list[str]:
    """Where ``path`` reads or sets another library's private attribute: ``mod._x`` on an
    imported module, ``getattr(x, "_x")``, or an assignment to ``__class__``."""
    tree = ast.parse(path.read_text())
    modules = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules.update(a.asname or a.name for a in node.names if node.module != "agentd")
            if node.module.startswith("agentd."):
                modules.difference_update(a.asname or a.name for a in node.names)
    modules -= {"agentd"}
    found: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            root = node.value
            while isinstance(root, ast.Attribute):
                root = root.value
            private = node.attr.startswith("_") and not node.attr.startswith("__")
            if private and isinstance(root, ast.Name) and root.id in modules:
                found.append((node.lineno, f"{path.name}:{node.lineno} {ast.unparse(node)}"))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "getattr":
            name = node.args[1] if len(node.args) > 1 else None
            if isinstance(name, ast.Constant) and isinstance(name.value, str):
                attr = name.value
                if attr.startswith("_") and not attr.startswith(("__", *ALLOWED_PRIVATE)):
                    found.append((node.lineno, f"{path.name}:{node.lineno} getattr(..., {attr!r})"))
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute) and target.attr == "__class__":
                    found.append(
                        (node.lineno, f"{path.name}:{node.lineno} {ast.unparse(target)} =")
                    )
    return [use for _, use in sorted(found)]


def test_private_parts_of_other_libraries_are_used_only_from_compat():
    compat = PACKAGE / "support" / "compat"
    found = [
        use
        for path in sorted(PACKAGE.rglob("*.py"))
        if compat not in path.parents
        for use in private_uses(path)
        if not use.endswith(DOCUMENTED)
    ]
    assert found == []


def test_the_private_use_check_finds_them(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        "import runpy\nfrom torch import distributed as dist\n"
        "runpy._run_module_as_main('x')\nw = getattr(policy, '_watcher', None)\n"
        "h.__class__ = K\nx = dist.distributed_c10d._world\nself._mine = 1\n"
    )
    assert [use.split(" ", 1)[1] for use in private_uses(sample)] == [
        "runpy._run_module_as_main",
        "getattr(..., '_watcher')",
        "h.__class__ =",
        "dist.distributed_c10d._world",
    ]


def test_pyproject_pins_the_tested_ranges():
    """Each runtime dependency has an upper bound, and the installed release is in it."""
    import tomllib

    from packaging.requirements import Requirement

    project = tomllib.loads((PACKAGE.parent / "pyproject.toml").read_text())["project"]
    for line in project["dependencies"]:
        requirement = Requirement(line)
        assert any(s.operator == "<" for s in requirement.specifier), line
        assert version(requirement.name) in requirement.specifier, (
            f"{requirement.name} {version(requirement.name)} is outside {line!r}"
        )
