"""Runs PyTorch's own elastic unit tests against torch and against agentd's mirror.

    python bench/torch_parity.py PYTORCH_TEST_DIR [--only agentd|torch] [--files F,...]

PYTORCH_TEST_DIR is the ``test/`` folder of a pytorch source checkout at the version that
is installed (its wheel does not ship tests). Each file below is copied into a scratch
folder twice: as it is, and with only the import prefix changed
(``torch.distributed.elastic.`` -> ``agentd.elastic.``,
``torch.distributed.launcher.api`` -> ``agentd.launcher``). Both copies run under
pytest, one process per file (a new one after a test that kills pytest itself), and the
script prints, per file and in total, how many tests pass on torch and how many of
*those* pass on agentd, then every test that passes on torch and fails on agentd.
This is how issue 25 measures parity.

Needs: torch, ``expecttest`` (torch's test utilities import it), ``python-etcd`` and the
``etcd`` binary (torch's etcd backends and ``EtcdServer``). One adjustment is made to
both copies: test-utility names that the installed torch's ``common_utils`` lacks
(``sandcastle_skip_if``, ``HardwareClassification``) are replaced by the ones it has, so
a newer checkout runs on an older torch.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from report_files import write_report

FILES = [
    "distributed/elastic/agent/server/test/api_test.py",
    "distributed/elastic/agent/server/test/local_elastic_agent_test.py",
    "distributed/elastic/timer/api_test.py",
    "distributed/elastic/timer/local_timer_test.py",
    "distributed/elastic/timer/local_timer_example.py",
    "distributed/elastic/timer/file_based_local_timer_test.py",
    "distributed/elastic/events/lib_test.py",
    "distributed/elastic/metrics/api_test.py",
    "distributed/elastic/multiprocessing/errors/api_test.py",
    "distributed/launcher/api_test.py",
]
SUPPORT = ["distributed/launcher/bin"]
PREFIXES = [
    ("torch.distributed.elastic.", "agentd.elastic."),
    ("torch.distributed.launcher.api", "agentd.launcher"),
]
FILE_TIMEOUT = 1800
OUTCOME = re.compile(r"^(?P<id>\S+::\S+) (?P<outcome>PASSED|FAILED|SKIPPED|ERROR)", re.M)


def compat(text: str) -> str:
    """Adapts a newer test file's test-utility imports to the installed torch."""
    from torch.testing._internal import common_utils

    if not hasattr(common_utils, "sandcastle_skip_if"):
        text = re.sub(r"\bsandcastle_skip_if\b", "skip_but_pass_in_sandcastle_if", text)
    if not hasattr(common_utils, "HardwareClassification"):
        text = re.sub(r"^\s*HardwareClassification,\n", "", text, flags=re.M)
        text = re.sub(r"^\s*hw_classification = .*\n", "", text, flags=re.M)
        text = text.replace(", HardwareClassification", "")
    return text


def to_agentd(text: str) -> str:
    for old, new in PREFIXES:
        text = text.replace(old, new)
    return text


def stage(source: Path, flavour: str, root: Path) -> None:
    for rel in SUPPORT:
        if (source / rel).is_dir():
            shutil.copytree(source / rel, root / rel, dirs_exist_ok=True)
    for rel in FILES:
        text = compat((source / rel).read_text())
        if flavour == "agentd":
            text = to_agentd(text)
        dest = root / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        write_report(dest, text)  # whole, before pytest reads it


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args]


def run_in_own_group(cmd: list[str], cwd: Path, env: dict[str, str]) -> str:
    """Run ``cmd`` in a session of its own and return its stdout; whatever it leaves behind
    in that session (children of a test that killed pytest) is killed by process group."""
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=FILE_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    return out or ""


def run_file(path: Path) -> dict[str, str]:
    """Runs one test file; returns {Class::test: passed|failed|skipped|crashed}.

    Some tests kill the pytest process itself when a timer misfires; the test that was
    running is then counted as crashed and the rest of the file runs in a new process.
    """
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
    listed = subprocess.run(
        pytest_cmd("--collect-only", "-q", path.name),
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    pending = [line for line in listed.stdout.splitlines() if "::" in line]
    outcomes: dict[str, str] = {}
    while pending:
        done = run_in_own_group(pytest_cmd("-v", *pending), path.parent, env)
        for match in OUTCOME.finditer(done):
            outcomes[match["id"]] = match["outcome"].lower().replace("error", "failed")
        pending = [test for test in pending if test not in outcomes]
        if pending:
            outcomes[pending.pop(0)] = "crashed"
    return {test.split("::", 1)[1]: outcome for test, outcome in outcomes.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("tests", type=Path, help="the test/ folder of a pytorch checkout")
    parser.add_argument("--only", choices=["agentd", "torch"], help="run one side only")
    parser.add_argument("--files", help="comma-separated substrings selecting files")
    args = parser.parse_args()
    files = [f for f in FILES if not args.files or any(s in f for s in args.files.split(","))]
    flavours = [args.only] if args.only else ["torch", "agentd"]
    results: dict[str, dict[str, dict[str, str]]] = {f: {} for f in flavours}
    with tempfile.TemporaryDirectory(prefix="parity-") as scratch:
        for flavour in flavours:
            root = Path(scratch) / flavour
            stage(args.tests, flavour, root)
            for rel in files:
                results[flavour][rel] = run_file(root / rel)
                passed = sum(v == "passed" for v in results[flavour][rel].values())
                print(
                    f"  {flavour:6} {rel}: {passed}/{len(results[flavour][rel])} passed", flush=True
                )
    if len(flavours) < 2:
        return 0
    total_torch = total_both = 0
    regressions: list[str] = []
    print(f"\n{'file':68} {'torch':>6} {'agentd':>6}")
    for rel in files:
        on_torch = {t for t, v in results["torch"][rel].items() if v == "passed"}
        on_agentd = {t for t, v in results["agentd"][rel].items() if v == "passed"}
        both = on_torch & on_agentd
        total_torch += len(on_torch)
        total_both += len(both)
        regressions += [f"{rel}::{t}" for t in sorted(on_torch - on_agentd)]
        print(f"{rel:68} {len(on_torch):>6} {len(both):>6}")
    print(
        f"{'total (agentd counts tests that also pass on torch)':68} "
        f"{total_torch:>6} {total_both:>6}"
    )
    if regressions:
        print("\npass on torch, fail on agentd:")
        print("\n".join(f"  {r}" for r in regressions))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
