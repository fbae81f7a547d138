"""The embedded store is never open without a secret: another local user cannot touch a
job, though the agents of one user on one host need no configuration to meet."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess

import pytest

from tests.chaos.conftest import require_root
from tests.conftest import free_port, wait_until
from tests.helpers.jobs import FAST, agent_args, member_job, world_sizes

ATTACK = """
import json, sys, urllib.request, urllib.error
url = f"http://127.0.0.1:{sys.argv[1]}/v1/set"
body = json.dumps({"key": "agentd/job/ctl/closed", "value": "eyJvdXRjb21lIjogImZhaWxlZCJ9"})
try:
    urllib.request.urlopen(urllib.request.Request(url, body.encode(), method="POST"), timeout=5)
    print("accepted")
except urllib.error.HTTPError as exc:
    print(exc.code)
try:
    print(open(sys.argv[2]).read())
except OSError as exc:
    print(type(exc).__name__)
"""


def attacker_python() -> str:
    """An interpreter another user can run (this venv's may live under /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK):
            return candidate
    pytest.skip("no system python3 for the other user")


def test_another_user_cannot_close_a_job_on_a_loopback_store(run_agentd, tmp_path):
    require_root("running a request as another user")
    port = free_port()
    stop = tmp_path / "stop"
    agents = [
        run_agentd(*agent_args(f"127.0.0.1:{port}", "2", conf=FAST), *member_job(stop))
        for _ in range(2)
    ]  # no token anywhere: the hosting agent makes one
    for agent in agents:
        wait_until(lambda a=agent: world_sizes(a, 0) == {2}, what="a job of two")
    [host] = [a for a in agents if "Hosting the rendezvous store" in a.stderr()]
    token_file = re.search(r"its token in (\S+?),", host.stderr()).group(1)
    info = os.stat(token_file)
    assert stat.S_IMODE(info.st_mode) == 0o600
    assert stat.S_IMODE(os.stat(os.path.dirname(token_file)).st_mode) == 0o700
    nobody = subprocess.run(
        [attacker_python(), "-c", ATTACK, str(port), token_file],
        user=65534,
        group=65534,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert nobody.stdout.split() == ["401", "PermissionError"], nobody.stderr
    stop.touch()
    assert [a.wait(30) for a in agents] == [0, 0]  # the job never noticed
    assert not os.path.exists(token_file)  # gone with the store that made it
    assert json.loads((host.log_dir / "job" / "result.json").read_text())["state"] == "SUCCEEDED"
