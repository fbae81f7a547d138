#!/usr/bin/env bash
# The GPU check: tests/gpu/ and the GPU benchmarks on one CUDA GPU, in at most 9.5 minutes
# (about 6 expected), ending in one table: the tests, a CUDA-ready standby's memory, the
# one-rank NCCL restart and its abort (with NCCL's monitoring thread on and off), and the
# in-process recovery with CUDA-ready standbys (the survivors' state handed over through
# the process group, then mapped from their GPU memory: CUDA IPC), plain standbys, none,
# and new processes (on CPU: plain standbys, through the group then shared memory). On a
# GPU, the figures go to docs/figures.json too (named gpu_*, the GPU and torch named, the
# spread and the route in each note), copied to OUT_DIR/figures.json to bring back.
# Each step's timeout keeps the whole under the device tool's 10 minutes a command. Run
# from the repository root, agentd from its source tree:
#
#     bash bench/gpu_check.sh --fetch-wheels   # here first: the test tools' wheels, in .whl/
#     bash bench/gpu_check.sh [OUT_DIR]        # there, with .whl/ carried along
#
# GPU_CHECK_SKIP_RECOVERY=1 leaves the recovery benchmarks out (a rerun of the rest).
# The GPU machine has python3 with torch (CUDA), aiohttp and psutil, and cannot fetch
# packages: the wheels in .whl/ (pytest, pytest-timeout, pytest-asyncio, and pynvml for
# the test that asks NVML who holds GPU memory: pure Python, fetched here by
# --fetch-wheels, CI's versions) are unpacked into a scratch folder ahead of whatever the
# machine has (the tests' hooks need pytest 8 or later). pytest runs without the project's addopts (they name
# pytest-xdist's options). Logs go to OUT_DIR (default: $OUT, else a temporary folder).
# Without a GPU the tests skip and the GPU benchmarks say so: the script still runs end to
# end (that is how it is tried on CPU).
set -uo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
if [ "${1:-}" = --fetch-wheels ]; then
    rm -rf .whl && mkdir .whl
    exec "$py" -m pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d .whl \
        pytest==9.2.0 pluggy==1.7.0 iniconfig==2.3.1 packaging==26.4 pygments==2.21.0 \
        pytest-timeout==2.4.0 pytest-asyncio==1.5.0 typing-extensions==4.16.0 \
        nvidia-ml-py==13.615.71
fi
out="${1:-${OUT:-$(mktemp -d)}}"
mkdir -p "$out"
: > "$out/bench.txt"  # this run's figures only, in an OUT_DIR used before
unset PYTHONDONTWRITEBYTECODE
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if ls .whl/*.whl >/dev/null 2>&1; then  # a wheel of pure Python is its files, zipped
    for wheel in .whl/*.whl; do "$py" -m zipfile -e "$wheel" /tmp/gpu-check-site; done
    export PYTHONPATH="/tmp/gpu-check-site:$PYTHONPATH"  # CI's versions, before the machine's
elif ! "$py" -c "import pytest, pytest_timeout, pytest_asyncio" 2>/dev/null; then
    echo "pytest, pytest-timeout or pytest-asyncio is missing and .whl/ has no wheels" \
        "(bash bench/gpu_check.sh --fetch-wheels, then carry .whl): the tests will not run"
fi
step() { echo; echo "=== $1 ($(date +%T))"; }

step "machine"
{
    nvidia-smi -L 2>&1 || echo "no nvidia-smi"
    "$py" - <<'PY'
import os, platform, torch
cuda = torch.cuda.is_available()
nccl = ".".join(map(str, torch.cuda.nccl.version())) if cuda else "-"
print(f"python {platform.python_version()}, torch {torch.__version__}, CUDA {torch.version.cuda}, "
      f"NCCL {nccl}, GPU {torch.cuda.get_device_name() if cuda else 'none'}, {os.cpu_count()} CPUs")
PY
} 2>&1 | tee "$out/machine.txt"

step "tests/gpu (and the in-process tests that reproduce the GPU's slow exit on CPU)"
timeout 190 "$py" -m pytest -q -rA -p no:cacheprovider -o addopts= tests/gpu tests/gpus \
    tests/inprocess/test_restart.py tests/inprocess/test_handover.py \
    -k "gpu or GPU or lags or fallback or nccl or standby or route" 2>&1 \
    | tee "$out/tests.txt" | grep -v "^PASSED\|^SKIPPED" | tail -30

device=cuda
"$py" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || device=cpu
nccl_run() {  # NAME [ENV=VALUE]: one NCCL rank whose training function raises 5 times
    local dir
    dir="$(mktemp -d)"
    env "${@:2}" timeout 60 "$py" -m agentd run --standalone --nproc-per-node 1 --max-restarts 5 \
        --inprocess-quick-restarts 0 tests/workers/torch_nccl_inprocess.py "$dir" raise \
        > "$out/nccl-$1.log" 2>&1
    "$py" - "$dir" "$1" <<'PY' | tee -a "$out/bench.txt"
import json, statistics, sys
from pathlib import Path
out = Path(sys.argv[1])
calls = [json.loads(line) for line in (out / "rank0.jsonl").read_text().splitlines()]
raised = [float(t) for t in (out / "rank0.raised").read_text().split()]
restart = [c["called_at"] - r for c, r in zip(calls[1:], raised)]
park = [c["teardown_s"] for c in calls[1:]]
mib = lambda key: "/".join(str(c[key] >> 20) for c in calls)
ms = lambda xs: f"median {statistics.median(xs) * 1000:.0f} ms ({min(xs) * 1000:.0f}-{max(xs) * 1000:.0f})"
print(f"  nccl-raise {sys.argv[2]}: {len(calls)} calls in {len({c['pid'] for c in calls})} process(es); "
      f"restart {ms(restart)}; the park's teardown {ms(park)}; allocated MiB {mib('allocated')}; "
      f"device used MiB {mib('device_used')}")
import torch
sys.path.insert(0, "bench")
from figures import record
how = {"no-monitor": "TORCH_NCCL_ENABLE_MONITORING=0", "wait": "AGENTD_INPROCESS_NCCL_ABORT=wait"}
record(
    "gpu_nccl_restart" + {"no-monitor": "_no_monitoring", "wait": "_abort_waited"}.get(sys.argv[2], ""),
    f"{statistics.median(restart) * 1000:,.0f} ms",
    "bash bench/gpu_check.sh (agentd run --standalone --nproc-per-node 1 --max-restarts 5 "
    "--inprocess-quick-restarts 0 tests/workers/torch_nccl_inprocess.py DIR raise)",
    f"one NCCL rank whose training function raises 5 times ({how.get(sys.argv[2], 'the defaults')}): "
    f"from each raise to the next call, {ms(restart)}; the park's teardown {ms(park)}; {len(calls)} calls in "
    f"{len({c['pid'] for c in calls})} process(es)",
    device=f"{torch.cuda.get_device_name()}, torch {torch.__version__}",
)
PY
}
if [ "$device" = cuda ]; then
    step "NCCL, one rank whose training function raises 5 times (the defaults, monitoring off, the park waiting for the abort)"
    nccl_run default
    nccl_run no-monitor TORCH_NCCL_ENABLE_MONITORING=0
    nccl_run wait AGENTD_INPROCESS_NCCL_ABORT=wait
fi
step "NCCL's abort, timed alone (abort, destroy, and a park that leaves it to a thread)"
timeout 100 "$py" bench/bench_nccl_abort.py --rounds 3 --record 2>&1 | tee -a "$out/bench.txt"
if [ -z "${GPU_CHECK_SKIP_RECOVERY:-}" ]; then  # set: a rerun of the other parts alone
step "a rank lost, the model on $device (256 MiB): standbys with CUDA ready (the state through the group, then CUDA IPC), standbys, none, new processes"
bench() { timeout "$1" "$py" bench/bench_recovery.py "${@:2}" 2>&1 | tee -a "$out/bench.txt"; }
standby=agentd-inprocess-cuda,agentd-inprocess-cuda-ipc,agentd-inprocess
[ "$device" = cuda ] || standby=agentd-inprocess,agentd-inprocess-shm  # no CUDA ever ready
# a run that does not recover costs at most 30 s, and a launcher is dropped after two:
# one broken launcher cannot take the others' figures down with it
# --record writes the GPU's figures (on a GPU only) to docs/figures.json, copied to OUT_DIR
bench 170 --device "$device" --model-mb 256 --runs 5 --timeout 30 --give-up-after 2 \
    --record --launchers "$standby"
bench 80 --device "$device" --model-mb 256 --runs 2 --timeout 30 --give-up-after 1 \
    --record --launchers agentd-inprocess-cold,agentd,agentd-spawn
fi
cp docs/figures.json "$out/figures.json"

step "summary"
"$py" - "$out" <<'PY'
import json, re, sys
from pathlib import Path
out = Path(sys.argv[1])
machine = (out / "machine.txt").read_text().strip().splitlines()[-1]
text = (out / "tests.txt").read_text()
tests = [l for l in text.splitlines() if re.search(r"\d+ (passed|failed)", l)]
print(f"| {machine} |")
print("| what | result |\n| --- | --- |")
print(f"| tests/gpu, tests/gpus, the in-process fault tests | {tests[-1].strip('= ') if tests else 'no result'} |")
for line in text.splitlines():
    if line.startswith('{"since_boot"'):
        print(f"| a CUDA-ready standby before its hand-over: GPU MiB held | {json.loads(line)['mib']} |")
    elif line.startswith("agent:") and "GPU memory" in line:
        print(f"| the lost rank's GPU memory at its standby's hand-over | {line[7:]} |")
    elif line.startswith("nccl restart ms:"):
        print(f"| tests/gpu: one NCCL rank, 5 restarts | {line} |")
where = "?"
for line in (out / "bench.txt").read_text().splitlines():
    if line.startswith("launch ->"):
        where = re.search(r"\(gloo(.*?)\)", line).group(1).strip(", ") or "cpu"
    elif "first step  median" in line:
        print(f"| {line.split()[0]}, time to first step: {where} | {' '.join(line.split()[3:])} |")
    elif "recovered" in line and not line.startswith("crash"):
        print(f"| {line.split()[0]}: {where} | {' '.join(line.split()[1:])} |")
    elif "the new rank" in line:
        label, figures = line.strip().rsplit(": ", 1)
        print(f"| {label}: {where} | {figures} |")
    elif line.startswith("  NCCL"):  # bench_nccl_abort.py's lines
        label, figures = line.strip().split(": ", 1)
        print(f"| NCCL's teardown, one rank ({label}) | {figures} |")
    elif "nccl-raise" in line:
        label, figures = line.strip().split(": ", 1)
        print(f"| NCCL, one rank raising 5 times ({label.split()[1]}) | {figures} |")
PY
