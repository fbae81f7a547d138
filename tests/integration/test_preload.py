"""--preload end to end: workers forked from a zygote are indistinguishable from spawned
ones, and every fault (a bad preload, a dead zygote, a killed agent) is handled."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import sys
import urllib.request
from pathlib import Path

import psutil
import pytest

from tests.conftest import TESTS, WORKER, free_port, pid_alive, wait_until

INTROSPECT = str(TESTS / "workers" / "introspect.py")


def descendants(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (zygotes and forked workers carry no owner mark
    in their start environment, so the fixture's cleanup cannot find them by it)."""
    try:
        return [p.pid for p in psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def zygotes_of(agent) -> list[int]:
    zygotes = []
    for child in psutil.Process(agent.pid).children():
        try:
            if "agentd.preload.zygote" in child.cmdline():
                zygotes.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return zygotes


def spares_of(zygote: int) -> list[int]:
    """The zygote's children forked ahead, waiting to become workers."""
    found = []
    for child in psutil.Process(zygote).children():
        try:
            if re.fullmatch(rf"agentd: standby worker \d+ of zygote {zygote}", child.cmdline()[0]):
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def held_spares(port: int, zygote: int, count: int) -> list[int]:
    """Once the agent at health ``port`` holds ``count`` spares of ``zygote``, their pids. A
    spare runs, titled, before the agent holds it (the zygote's word of it is on its way):
    a restart then forks anew, as on a loaded CI machine once (2026-12-03)."""

    def held() -> list[int]:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
            return json.loads(response.read())["preload"]["standby_pids"]

    pids = wait_until(lambda: len(found := held()) == count and found, what=f"{count} spares")
    assert sorted(pids) == sorted(spares_of(zygote))
    return pids


def reports(agent, nproc: int) -> list[dict]:
    return [json.loads((agent.out_dir / f"report_{r}.json").read_text()) for r in range(nproc)]


def run_introspect(run_agentd, tmp_path: Path, *flags: str, code: str = "0"):
    agent = run_agentd(
        "--nproc-per-node",
        "2",
        "--tee",
        "3",
        *flags,
        INTROSPECT,
        code,
        "arg one",
        env={"EXTRA_VAR": "extra"},
        cwd=tmp_path,
    )
    assert agent.wait(timeout=60) == int(code.split(",")[-1] != "0"), agent.stderr()
    return agent


RESTARTED = ("argv", "cmdline", "TORCHELASTIC_RESTART_COUNT", "AGENTD_ATTEMPT", "fds_3_up")
"""What differs in the report of a worker of a job that restarted: its attempt, the code
argument, and the in-process restart channel it inherits (a job that may restart)."""


def test_forked_workers_look_exactly_like_spawned_ones(run_agentd, tmp_path):
    spawned = run_introspect(run_agentd, tmp_path, "--no-preload")
    numpy = importlib.util.find_spec("numpy") is not None
    modules = "json,email.message" + (",numpy" if numpy else "")
    forked = run_introspect(run_agentd, tmp_path, "--preload", modules)
    default = run_introspect(run_agentd, tmp_path)  # auto: introspect.py imports numpy
    # The restart's workers come from spares, forked ahead during the backoff.
    restart = ("--max-restarts", "1", "--restart-backoff", "0.5")
    from_spares = run_introspect(run_agentd, tmp_path, "--preload", modules, *restart, code="1,0")
    assert "Zygote pid" in forked.stderr() and "Zygote pid" not in spawned.stderr()
    assert "workers spawned (--preload off)" in spawned.stderr()
    if numpy:
        assert "preloading numpy (auto: introspect.py imports numpy)" in default.stderr()
    randoms = ("random", "numpy_random")
    for other in (forked, default, from_spares):
        for before, after in zip(reports(spawned, 2), reports(other, 2), strict=True):
            dropped = (*randoms, "MASTER_PORT", *(RESTARTED if other is from_spares else ()))
            for name in dropped:
                (before if name in before else before["env"]).pop(name, None)
                (after if name in after else after["env"]).pop(name, None)
            assert before == after
    [a, b] = reports(forked, 2)
    for name in randoms if numpy else randoms[:1]:
        assert a[name] != b[name]  # each fork reseeded: not the zygote's sequence twice
    assert a["argv"] == [INTROSPECT, "0", "arg one"] and a["name"] == "__main__"
    [a, b] = reports(from_spares, 2)
    assert a["argv"] == [INTROSPECT, "1,0", "arg one"] and a["cmdline"][-3:] == a["argv"]
    assert a["env"]["TORCHELASTIC_RESTART_COUNT"] == a["env"]["AGENTD_ATTEMPT"] == "1"
    assert a["fds_3_up"] == reports(spawned, 2)[0]["fds_3_up"] + 1  # the channel
    for agent in (spawned, forked, default, from_spares):
        attempt = 1 if agent is from_spares else 0
        for rank in (0, 1):
            assert (agent.out_dir / f"atexit_{rank}").read_text() == "ran"
            assert (agent.out_dir / f"thread_{rank}").read_text() == "joined"
            assert f"[default{rank}]:stdout of rank {rank}" in agent.stdout()
            assert f"[default{rank}]:stderr of rank {rank}" in agent.stderr()
            [log] = agent.log_dir.glob(f"*/attempt_{attempt}/{rank}/stdout.log")
            assert log.read_text() == f"stdout of rank {rank}\n"


def test_exit_codes_and_stderr_tail_reach_the_report(run_agentd, tmp_path):
    agent = run_introspect(run_agentd, tmp_path, "--preload=json", code="7")
    [result] = agent.log_dir.glob("*/result.json")
    root = json.loads(result.read_text())["root_cause"]
    assert root["exitcode"] == 7
    assert "stderr of rank" in agent.stderr()


def test_module_entrypoint_runs_as_python_dash_m(run_agentd, tmp_path):
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text(
        "import json, os, sys\n"
        "out = os.environ['TEST_AGENTD_OUT']\n"
        "open(os.path.join(out, 'module'), 'w').write(json.dumps("
        "[__name__, __spec__.name, sys.argv, sys.path[0]]))\n"
    )
    agent = run_agentd("--preload", "json", "-m", "pkg.job", "x", cwd=tmp_path)
    assert agent.wait(timeout=60) == 0, agent.stderr()
    name, spec, argv, path0 = json.loads((agent.out_dir / "module").read_text())
    assert (name, spec) == ("__main__", "pkg.job")
    assert argv == [str(package / "job.py"), "x"] and path0 == str(tmp_path)


def test_a_preload_module_that_fails_is_a_one_line_error_exit_2(run_agentd, tmp_path):
    (tmp_path / "broken_mod.py").write_text("x = 1\nraise RuntimeError('no GPU driver')\n")
    (tmp_path / "job.py").write_text("print('never')\n")
    agent = run_agentd("--preload", "json,broken_mod", "job.py", cwd=tmp_path)
    assert agent.wait(timeout=60) == 2
    err = agent.stderr()
    line = "--preload: importing 'broken_mod' failed: RuntimeError: no GPU driver (broken_mod.py:2)"
    assert line in err and "never" not in agent.stdout()
    assert "Traceback" not in err


def test_a_missing_preload_module_is_named(run_agentd, tmp_path):
    (tmp_path / "job.py").write_text("print('never')\n")
    agent = run_agentd("--preload", "no_such_module_x", "job.py", cwd=tmp_path)
    assert agent.wait(timeout=60) == 2
    assert "--preload: importing 'no_such_module_x' failed: ModuleNotFoundError" in agent.stderr()


def test_a_preload_that_starts_cuda_is_refused(run_agentd, tmp_path):
    pytest.importorskip("torch")
    # torch.cuda.is_initialized() reads this flag: the zygote's check sees a CUDA context
    (tmp_path / "fake_cuda.py").write_text("import torch.cuda\ntorch.cuda._initialized = True\n")
    (tmp_path / "job.py").write_text("print('never')\n")
    agent = run_agentd("--preload", "fake_cuda", "job.py", cwd=tmp_path)
    assert agent.wait(timeout=120) == 2
    assert "--preload: the preloaded modules initialized CUDA" in agent.stderr()


def test_no_preload_overrides_the_environment(run_agentd, tmp_path):
    agent = run_introspect(run_agentd, tmp_path, "--no-preload")
    assert "Zygote" not in agent.stderr()
    env_on = run_agentd(
        "--nproc-per-node", "1", INTROSPECT, "0", env={"AGENTD_PRELOAD": "json"}, cwd=tmp_path
    )
    assert env_on.wait(timeout=60) == 0, env_on.stderr()
    assert "Zygote pid" in env_on.stderr()


def test_zygote_killed_mid_job_restarts_with_a_new_zygote(run_agentd):
    port = free_port()
    agent = run_agentd(
        "--preload=json",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--health-port",
        str(port),
        WORKER,
        "sleep",
    )
    workers = agent.wait_ready(2)
    [zygote] = wait_until(lambda: zygotes_of(agent), what="the zygote")
    agent.extra_pids += [*workers, zygote]
    os.kill(zygote, signal.SIGKILL)
    wait_until(lambda: not any(pid_alive(p) for p in workers), what="workers gone")
    new_workers = agent.wait_ready(2, attempt=1)
    agent.extra_pids += new_workers
    [new_zygote] = wait_until(lambda: zygotes_of(agent), what="a new zygote")
    agent.extra_pids.append(new_zygote)
    assert new_zygote != zygote
    assert all(psutil.Process(p).ppid() == new_zygote for p in new_workers)
    err = agent.stderr()
    assert f"Zygote pid {zygote} died (exit status -9); starting a new one" in err
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
        preload = json.loads(response.read())["preload"]
    standbys = preload.pop("standby_pids")
    assert 0 < preload.pop("preload_seconds") < 60  # json's import, in the longer of the two
    assert preload == {
        "modules": ["json"],
        "zygote_pid": new_zygote,
        "ready": True,
        "zygotes_started": 2,
        "standby_workers": 2,  # one per local rank: the job may restart
        "standby_cuda": False,
    }
    assert len(standbys) <= 2

    held_spares(port, new_zygote, 2)  # forked once the new zygote is quiet: /status as ps
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 128 + signal.SIGTERM
    assert not any(pid_alive(p) for p in [*new_workers, new_zygote])


@pytest.mark.parametrize("packed", [False, True], ids=["directory", "zip-application"])
def test_a_directory_or_zip_with_a_main_is_forked_as_python_runs_it(run_agentd, tmp_path, packed):
    """``python app/`` and ``python app.pyz`` run the ``__main__.py`` inside, with
    ``sys.argv[0]`` the directory or archive and it first on the path; a forked worker sees
    the same as a spawned one (a forked zip application failed: its bytes were compiled)."""
    import zipapp

    app = tmp_path / "app"
    app.mkdir()
    (app / "__main__.py").write_text(
        "import os, sys\n"  # one write: two workers' lines do not interleave on stdout
        "line = [os.environ['LOCAL_RANK'], sys.argv[0], __file__, sys.path[0]]\n"
        "sys.stdout.write(' '.join(line) + '\\n')\n"
    )
    if packed:
        zipapp.create_archive(app, tmp_path / "app.pyz")
        app = tmp_path / "app.pyz"
    seen = {}
    for mode, start in (("--preload=json", "forked from a zygote"), ("--no-preload", "spawned")):
        agent = run_agentd("--standalone", mode, "--nproc-per-node", "2", str(app))
        assert agent.wait(60) == 0, agent.stderr()[-2000:]
        assert f"workers {start}" in agent.stderr()
        seen[mode] = sorted(agent.stdout().splitlines())
    assert (
        seen["--preload=json"]
        == seen["--no-preload"]
        == [f"{rank} {app} {app / '__main__.py'} {app}" for rank in range(2)]
    )


def test_standbys_asked_of_a_group_that_never_restarts_are_not_forked(run_agentd):
    """One node, ``--max-restarts 0``: no restart can use a standby, which would only hold
    memory (with ``--standby-cuda``, a CUDA context each). None is forked, and it is said."""
    port = free_port()
    agent = run_agentd(
        *("--preload=json", "--nproc-per-node", "2", "--standby-workers", "2"),
        *("--health-port", str(port), WORKER, "sleep"),
    )
    workers = agent.wait_ready(2)
    agent.extra_pids += workers
    [zygote] = wait_until(lambda: zygotes_of(agent), what="the zygote")
    agent.extra_pids.append(zygote)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=10) as response:
        preload = json.loads(response.read())["preload"]
    assert preload["standby_workers"] == 0 and preload["standby_pids"] == []
    assert spares_of(zygote) == []
    assert (
        "standby_workers 2 ignored: a group of one node with max_restarts 0 is never "
        "restarted, so no standby worker is forked"
    ) in agent.stderr()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 128 + signal.SIGTERM


def test_a_script_that_preloads_nothing_restarts_from_a_bare_zygote(run_agentd):
    """The first workers are spawned (a zygote would only delay them), the zygote starts
    once they run, and the next attempt is forked from it."""
    port = free_port()
    agent = run_agentd(
        *("--nproc-per-node", "2", "--max-restarts", "1", "--health-port", str(port)),
        *(WORKER, "sleep"),
    )
    first = agent.wait_ready(2)
    agent.extra_pids += first
    assert all(psutil.Process(p).ppid() == agent.pid for p in first)
    [zygote] = wait_until(lambda: zygotes_of(agent), what="the bare zygote")
    agent.extra_pids.append(zygote)
    wait_until(lambda: "Zygote pid" in agent.stderr(), what="the zygote ready")
    spares = held_spares(port, zygote, 2)
    agent.extra_pids += spares
    os.kill(first[0], signal.SIGKILL)
    second = agent.wait_ready(2, attempt=1)
    agent.extra_pids += second
    assert sorted(second) == sorted(spares)  # forked ahead: the restart forked nothing
    [run_dir] = agent.log_dir.iterdir()  # and its directories were made ahead, as are the next
    assert sorted(p.name for p in (run_dir / "attempt_1").iterdir()) == ["0", "1"]
    next_attempt = run_dir / ".attempt_next"
    wait_until(lambda: next_attempt.is_dir() and len(list(next_attempt.iterdir())) == 2)
    err = agent.stderr()
    said = "first workers spawned, restarts forked from a bare zygote (auto: worker.py imports none"
    assert said in err
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 128 + signal.SIGTERM
    assert not any(pid_alive(p) for p in [*second, zygote])
    assert not next_attempt.exists()  # no attempt follows


def test_a_script_edited_after_the_spares_compiled_it_runs_as_edited(run_agentd, tmp_path):
    """Spares compile the job's script while they wait; a restart after the file changed
    runs the file as it is then, as a spawned worker would."""
    job = tmp_path / "job.py"
    job.write_text(Path(WORKER).read_text())
    port = free_port()
    agent = run_agentd(
        *("--nproc-per-node", "2", "--max-restarts", "1", "--health-port", str(port)),
        *(str(job), "sleep"),
    )
    first = agent.wait_ready(2)
    agent.extra_pids += first
    [zygote] = wait_until(lambda: zygotes_of(agent), what="the bare zygote")
    agent.extra_pids.append(zygote)
    spares = held_spares(port, zygote, 2)
    agent.extra_pids += spares
    source = job.read_text()
    edit = "from __future__ import annotations\n"
    mark = 'import os as _o; open(_o.environ["TEST_AGENTD_OUT"] + "/edited", "w").close()\n'
    job.write_text(source.replace(edit, edit + mark, 1))
    os.kill(first[0], signal.SIGKILL)
    second = agent.wait_ready(2, attempt=1)
    agent.extra_pids += second
    assert sorted(second) == sorted(spares)
    assert (agent.out_dir / "edited").exists()
    agent.proc.send_signal(signal.SIGTERM)
    assert agent.wait(timeout=60) == 128 + signal.SIGTERM


def test_zygote_killed_between_attempts(run_agentd):
    agent = run_agentd(
        "--preload=json",
        "--nproc-per-node",
        "2",
        "--max-restarts",
        "1",
        "--restart-backoff",
        "3",
        WORKER,
        "flaky",
    )
    [zygote] = wait_until(lambda: zygotes_of(agent), what="the zygote")
    agent.extra_pids.append(zygote)
    wait_until(lambda: "before restarting (backoff)" in agent.stderr(), what="the backoff")
    assert "Restarting worker group" not in agent.stderr()  # within the 3 s backoff
    os.kill(zygote, signal.SIGKILL)
    assert agent.wait(timeout=60) == 0, agent.stderr()
    err = agent.stderr()
    assert f"Zygote pid {zygote} died" in err and err.count("ready: preloaded") == 2


def test_a_stopped_zygote_is_replaced_and_the_job_goes_on(run_agentd, tmp_path):
    """bench/bench_chaos.py seeds 0, 1 and 3 (2026-12-03), a zygote stopped (SIGSTOP)
    while its workers ran: the worker that failed was reported as SIGKILLed, and the
    restart's fork waited for the zygote's answer for ever, the agent silent after its
    rendezvous. The failure is now the worker's own, and the zygote that leaves a fork
    unanswered for 10 s is killed and replaced."""
    go, stop = tmp_path / "go", tmp_path / "stop"
    agent = run_agentd(
        "--preload=json",
        "--standby-workers",  # the restart's fork is asked of the zygote, not of a standby
        "0",
        "--max-restarts",
        "1",
        WORKER,
        "go-then-stop",
        "--go-file",
        str(go),
        "--stop-file",
        str(stop),
    )
    agent.extra_pids += agent.wait_ready(1)
    [zygote] = wait_until(lambda: zygotes_of(agent), what="the zygote")
    agent.extra_pids.append(zygote)
    os.kill(zygote, signal.SIGSTOP)
    try:
        go.touch()  # attempt 0's worker fails: its exit sits in the stopped zygote's zombie
        agent.extra_pids += agent.wait_ready(1, attempt=1)
    finally:
        with contextlib.suppress(ProcessLookupError):  # killed as it did not answer
            os.kill(zygote, signal.SIGCONT)
    stop.touch()
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    err = agent.stderr()
    assert re.search(r"Rank 0 \(pid \d+ on \S+\) failed with exit code 1", err), err[-3000:]
    assert (
        f"Zygote pid {zygote} did not answer a fork in 10s (it is stopped); killing it and "
        "starting a new one" in err
    )
    assert err.count("ready: preloaded json") == 2


@pytest.mark.parametrize("victim", ["agent", "zygote-then-agent"])
def test_killed_agent_leaves_nothing_alive(run_agentd, victim):
    agent = run_agentd("--preload=json", "--nproc-per-node", "2", WORKER, "tree")
    pids = agent.wait_ready(2)
    [zygote] = zygotes_of(agent)
    everything = [*pids, zygote, *descendants(agent.pid)]
    agent.extra_pids += everything
    if victim == "zygote-then-agent":
        os.kill(zygote, signal.SIGKILL)
    agent.proc.send_signal(signal.SIGKILL)
    agent.wait()
    wait_until(lambda: not any(pid_alive(p) for p in everything), what="nothing left")


def test_python_api_function_entrypoint_with_preload(tmp_path):
    from agentd import LocalElasticAgent, WorkerSpec
    from tests.workers.functions import rank_times

    spec = WorkerSpec(
        role="trainer", local_world_size=2, entrypoint=rank_times, args=(3,), preload=("json",)
    )
    result = LocalElasticAgent(spec, log_dir=tmp_path).run()
    assert result.return_values == {0: {"rank": 0, "value": 0}, 1: {"rank": 1, "value": 3}}


def test_preload_names_are_checked(run_agentd, tmp_path):
    agent = run_agentd("--preload", "torch,not-a-module", WORKER, "exit", cwd=tmp_path)
    assert agent.wait(timeout=30) == 2
    assert "--preload: 'torch,not-a-module' names 'not-a-module', which is not a module" in (
        agent.stderr()
    )
    noexe = run_agentd("--preload", "json", "--no-python", "true")
    assert noexe.wait(timeout=30) == 2
    assert "--preload: needs a Python script or module" in noexe.stderr()
    # the default is auto, which spawns an executable and says why
    auto = run_agentd("--no-python", "true")
    assert auto.wait(timeout=30) == 0, auto.stderr()
    assert "workers spawned (auto: --no-python runs an executable)" in auto.stderr()
    explicit = run_agentd("--preload", "AUTO", "--no-python", "true")
    assert explicit.wait(timeout=30) == 0, explicit.stderr()


torch_only = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None, reason="torch is not installed"
)


@torch_only
def test_ddp_trains_to_the_known_weights_across_a_forced_restart(run_agentd, tmp_path):
    script = str(TESTS / "workers" / "torch_ddp_restart.py")
    agent = run_agentd(
        "--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--preload", "torch", script
    )
    assert agent.wait(timeout=180) == 0, agent.stderr()
    out = agent.stdout()
    assert "learned weight [2.0, -3.0]" in out and "restart 1" in out
    assert "preloaded torch: True" in out  # the script's first line saw torch imported


@torch_only
def test_torch_record_and_file_timer_under_preload(run_agentd):
    agent = run_agentd("--preload", "torch", str(TESTS / "workers" / "torch_record.py"))
    assert agent.wait(timeout=120) == 1
    [result] = agent.log_dir.glob("*/result.json")
    root = json.loads(result.read_text())["root_cause"]
    assert root["message"] == "RuntimeError: torch-recorded failure: loss is NaN"
    timer = run_agentd(
        "--preload",
        "torch",
        "--max-restarts",
        "1",
        WORKER,
        "torch-timer-hang",
        "--until-attempt",
        "1",
        env={"TORCHELASTIC_ENABLE_FILE_TIMER": "1"},
    )
    assert timer.wait(timeout=120) == 0, timer.stderr()
    assert "torch timer ok on restart 1" in timer.stdout()
    assert "expired: sent SIGKILL" in timer.stderr()


def test_the_zygote_program_without_its_channel_is_a_usage_error():
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "agentd.preload.zygote"], capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 2 and "usage: python -m agentd.preload.zygote" in done.stderr


@pytest.mark.parametrize("how", ["--no-preload", "--preload=json"])
def test_workers_ignore_a_drain_signal_meant_for_their_agent(run_agentd, tmp_path, how):
    """Under ``--drain-on SIGUSR1`` (Slurm's default) a worker, spawned or forked, starts
    with SIGUSR1 ignored, as the zygote does: Slurm signals every process of the step. The
    stop signals keep their defaults (SIGTERM) or Python's (SIGINT)."""
    agent = run_introspect(run_agentd, tmp_path, "--drain-on", "SIGUSR1", how)
    for report in reports(agent, 2):
        handlers = report["handlers"]
        assert handlers[str(int(signal.SIGUSR1))] == repr(signal.SIG_IGN)
        assert handlers[str(int(signal.SIGTERM))] == repr(signal.SIG_DFL)
        assert handlers[str(int(signal.SIGUSR2))] == repr(signal.SIG_DFL)


def traceback_of(agent) -> list[str]:
    """The worker's traceback lines, as its stderr log has them (file names and code)."""
    [err] = agent.log_dir.glob("*/attempt_0/0/stderr.log")
    lines = err.read_text().splitlines()
    start = lines.index("Traceback (most recent call last):")
    return lines[start:]


@pytest.mark.parametrize("kind", ["script", "module"])
def test_a_forked_workers_traceback_is_a_spawned_ones(run_agentd, tmp_path, kind):
    """No agentd frame before the user's: the same lines as ``python job.py`` gives."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "job.py").write_text(
        "import json\n\n\ndef fail():\n    raise ValueError('x')\n\n\nfail()\n"
    )
    target = ["-m", "pkg.job"] if kind == "module" else [str(package / "job.py")]
    seen = []
    for preload in ("--preload=json", "--no-preload"):
        agent = run_agentd("--redirects", "3", preload, *target, cwd=tmp_path)
        assert agent.wait(timeout=60) == 1, agent.stderr()
        seen.append(traceback_of(agent))
    forked, spawned = seen
    assert forked == spawned
    assert "agentd" not in "\n".join(forked)
    assert forked[-1] == "ValueError: x"


def test_the_zygote_exits_with_its_atexit_functions_run_and_no_teardown(run_agentd, tmp_path):
    """The zygote leaves as a worker does (``os._exit`` after the ``atexit`` functions):
    the interpreter's teardown of what it preloaded, torch's 0.8 s, held the agent's exit
    at the end of every job. A preloaded module's exit function still runs there."""
    import re

    (tmp_path / "exiting_mod.py").write_text(
        "import atexit, os\n"
        "OUT = os.environ['TEST_AGENTD_OUT']\n"
        "def mark(what):\n"
        "    open(os.path.join(OUT, f'{what}_{os.getpid()}'), 'w').close()\n"
        "atexit.register(mark, 'atexit')\n"
        "class Teardown:\n"
        "    def __del__(self, _open=open, name=os.path.join(OUT, f'teardown_{os.getpid()}')):\n"
        "        _open(name, 'w').close()\n"
        "KEPT = Teardown()  # deleted as the interpreter tears the module down\n"
    )
    (tmp_path / "job.py").write_text("print('ran')\n")
    agent = run_agentd("--preload", "exiting_mod", "--nproc-per-node", "2", "job.py", cwd=tmp_path)
    assert agent.wait(timeout=60) == 0, agent.stderr()
    zygote = re.search(r"Zygote pid (\d+) ready", agent.stderr()).group(1)
    marks = {p.name for p in agent.out_dir.iterdir() if p.name.startswith(("atexit", "teardown"))}
    assert f"atexit_{zygote}" in marks, marks
    assert f"teardown_{zygote}" not in marks, marks
