"""The run's folder in a log directory that several hosts share (a cluster's filesystem)."""

from __future__ import annotations

import textwrap

from agentd.workers.run_folder import CLAIM, claim_run_dir
from tests.chaos.conftest import require_root
from tests.conftest import free_port


def test_the_first_host_claims_the_folder_and_another_gets_its_own(tmp_path):
    first = claim_run_dir(tmp_path, "job", "node-a")
    assert first == tmp_path / "job"
    assert (first / CLAIM).read_text() == "node-a\n"
    assert claim_run_dir(tmp_path, "job", "node-a") == first  # its agent, restarted
    assert claim_run_dir(tmp_path, "job", "node-b") == tmp_path / "job.node-b"
    assert claim_run_dir(tmp_path, "job", "node-b") == tmp_path / "job.node-b"
    assert sorted(p.name for p in first.iterdir()) == [CLAIM]  # no draft left behind


def test_a_folder_that_cannot_be_made_is_left_to_the_start_to_report(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert claim_run_dir(blocker, "job", "node-a") == blocker / "job"


def uts() -> tuple[str, ...]:
    """Run the agent under its own hostname (a UTS namespace): another host, to the log
    directory."""
    return ("unshare", "--uts", "--", "sh", "-c", 'hostname "$1" && shift && exec "$@"', "sh")


def test_two_hosts_at_one_log_dir_keep_their_workers_files_apart(run_agentd, tmp_path):
    """Before, both nodes' local rank 0 wrote ``<log-dir>/job/attempt_0/0/stdout.log``."""
    require_root("hosts of their own (UTS namespaces)")
    hello = tmp_path / "hello.py"
    hello.write_text(
        textwrap.dedent(
            """\
            import os
            print("hello from rank", os.environ["RANK"], flush=True)
            """
        )
    )
    logs = tmp_path / "shared"
    port = free_port()
    agents = [
        run_agentd(
            *f"--nnodes 2 --rdzv-backend c10d --rdzv-endpoint 127.0.0.1:{port}".split(),
            *["--rdzv-id", "job", "--log-dir", str(logs), "--redirects", "3", str(hello)],
            prefix=(*uts(), host),
            log_dir=False,
        )
        for host in ("node-a", "node-b")
    ]
    assert [agent.wait(120) for agent in agents] == [0, 0], agents[1].stderr()[-3000:]
    folders = sorted(p.name for p in logs.iterdir())
    assert folders in (["job", "job.node-b"], ["job", "job.node-a"]), folders
    said = sorted((logs / f / "attempt_0" / "0" / "stdout.log").read_text() for f in folders)
    assert said == ["hello from rank 0\n", "hello from rank 1\n"]
    assert all((logs / f / "result.json").exists() for f in folders)
