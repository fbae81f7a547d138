"""No secret reaches a child: every place agentd starts a process builds the child's
environment without the agent's secrets, and the helpers that print what they see (a node
check, the etcd server) never see one."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from agentd.nodecheck.checks import CommandCheck
from agentd.support.secrets import SECRET_ENV, child_env

PACKAGE = Path(__file__).resolve().parents[2] / "agentd"
STARTERS = {
    "create_subprocess_exec",
    "create_subprocess_shell",
    "Popen",
    "run",
    "call",
    "check_call",
    "check_output",
    "spawn_process",
    "system",
    "popen",
    "execv",
    "execve",
    "execvp",
    "execvpe",
    "posix_spawn",
    "posix_spawnp",
}
"""The names of calls that start a process (``subprocess.run``, not ``asyncio.run``)."""
CLEAN = ("child_env(", "without_secrets(", "common_env(")
"""Expressions that build a child's environment without the secrets."""
PASSED_ON = {
    ("agentd/workers/processes.py", "spawn_process"): "its callers pass a worker's "
    "environment (worker_env) or the zygote's (common_env)",
    ("agentd/workers/processes.py", "spawn_worker"): "a worker's environment (worker_env)",
    ("agentd/preload/client.py", "start"): "the zygote's environment (common_env), "
    "given by the preload service",
    ("agentd/hygiene/guardian_process.py", "run_will"): "the guardian's own "
    "environment, which the agent built with child_env",
}
"""Sites whose environment comes from their caller, with where it comes from."""


def _starts(node: ast.Call) -> bool:
    func = node.func
    if isinstance(func, ast.Attribute):
        owner = ast.unparse(func.value)
        if func.attr == "run":
            return owner == "subprocess"
        return func.attr in STARTERS and owner in ("subprocess", "asyncio", "os")
    return isinstance(func, ast.Name) and func.id in STARTERS - {"run", "call", "system"}


def process_starts() -> list[tuple[str, str, str | None]]:
    """Every call in agentd that starts a process: (file, enclosing function, how its
    ``env=`` is built, after one local assignment; None without ``env=``)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            assigned = {
                target.id: ast.unparse(node.value)
                for node in ast.walk(func)
                if isinstance(node, ast.Assign)
                for target in node.targets
                if isinstance(target, ast.Name)
            }
            for call in ast.walk(func):
                if not (isinstance(call, ast.Call) and _starts(call)):
                    continue
                env = next((k.value for k in call.keywords if k.arg == "env"), None)
                how = None if env is None else ast.unparse(env)
                if isinstance(env, ast.Name):
                    how = assigned.get(env.id, how)
                rel = str(path.relative_to(PACKAGE.parent))
                found.append((rel, func.name, how))
    return found


def test_every_process_agentd_starts_gets_an_environment_without_secrets():
    starts = process_starts()
    assert len(starts) >= 8, starts  # the workers, the zygote, the guardian, the helpers
    leaks = [
        (where, function, how)
        for where, function, how in starts
        if (where, function) not in PASSED_ON
        and not (how is not None and any(clean in how for clean in CLEAN))
    ]
    assert not leaks, f"processes started with the agent's own environment: {leaks}"


def test_child_env_drops_every_secret(monkeypatch):
    for name in SECRET_ENV:
        monkeypatch.setenv(name, "s3cret")
    monkeypatch.setenv("AGENTD_RDZV_CONF", "user=me,password=s3cret")
    env = child_env({"EXTRA": "1"})
    assert "s3cret" not in repr(env) and env["EXTRA"] == "1"
    assert env["AGENTD_RDZV_CONF"] == "user=me"


async def test_a_node_check_never_sees_the_store_token(monkeypatch):
    monkeypatch.setenv("AGENTD_STORE_TOKEN", "s3cret")
    result = await CommandCheck('sh -c "echo token=$AGENTD_STORE_TOKEN; exit 1"').run()
    assert (result.ok, result.detail) == (False, "exit code 1: token=")


def test_the_etcd_server_the_agent_starts_never_sees_a_secret(monkeypatch, tmp_path):
    from agentd.rendezvous.etcd_server import EtcdServer
    from tests.helpers.etcd_server import require_etcd

    require_etcd()
    monkeypatch.setenv("AGENTD_ETCD_PASSWORD", "s3cret")
    server = EtcdServer(data_dir=str(tmp_path / "etcd"))
    server.start()
    try:
        environ = Path(f"/proc/{server._proc.pid}/environ").read_bytes()
    finally:
        server.stop()
    assert b"s3cret" not in environ and os.environ["AGENTD_ETCD_PASSWORD"] == "s3cret"
