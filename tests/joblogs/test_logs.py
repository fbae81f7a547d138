"""``agentd logs`` with real agents (issue 50): three nodes on 127.0.0.1-3 with two ranks
each, every rank printing lines that carry the time they were printed; the command asked
of one agent prints every node's lines, prefixed ``host:rank aN|``, in time order, whole."""

from __future__ import annotations

import itertools
import re
import shutil
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

from tests.conftest import WORKER, wait_until
from tests.helpers.jobs import STEADY_MEMBER, TOKEN, agent_args
from tests.helpers.logs_plugin import flat_logs_installed

TICKS = 15
LINE = re.compile(r"(127\.0\.0\.\d):(\d+) a0\| tick (\d+) of rank (\d+) at ([\d.]+)\Z")
TICK = 0.3
"""Seconds between a rank's ticks: its 15 span 4.2 s."""
SLACK = 1.5
"""How far a merged line's print time may run behind the one before it: the line-times
file's 0.05 s, and the pipe's and a loaded machine's delay in between (an agent starved of
CPU stamps a whole chunk late: 0.75 s was overrun in a clean CI run on 2 cores, 2026-12-02,
with the suite at 14 minutes). Each rank's ticks span 4.2 s, so output merged by node
instead of by time would run back by more than twice this."""


def logs(*args: str) -> subprocess.CompletedProcess[str]:
    """``agentd logs ARGS`` (an agent's URL, or ``--dir`` and a folder, and options)."""
    command = [sys.executable, "-m", "agentd", "logs", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60)


def ticks(text: str) -> list[re.Match[str]]:
    return [m for line in text.splitlines() if (m := LINE.match(line))]


def test_every_nodes_lines_merged_in_time_order(run_agentd, run_store, tmp_path):
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    rdzv = agent_args(store.endpoint, "3:3", conf=STEADY_MEMBER)
    job = ["--nproc-per-node", "2", "--tee", "3", "--health-port", "0"]
    work = [WORKER, "ticks", "--code", str(TICKS), "--after", str(TICK), "--stop-file", str(stop)]
    agents = [
        run_agentd(*rdzv, "--local-addr", f"127.0.0.{i + 1}", *job, *work, env=env)
        for i in range(3)
    ]
    urls = [
        wait_until(lambda a=a: re.search(r"Health endpoint on (http://\S+)", a.stderr()), 30).group(
            1
        )
        for a in agents
    ]
    wait_until(
        lambda: all(a.stdout().count(f"tick {TICKS - 1} of") == 2 for a in agents),
        60,
        what="every tick",
    )

    def merged() -> list[re.Match[str]] | None:
        found = ticks(logs(urls[0]).stdout)
        return found if len(found) == 3 * 2 * TICKS else None

    lines = wait_until(merged, 30, what="every node's records, then every line")
    assert logs(urls[0]).stderr == ""  # every node keeps its files: no note
    printed = [float(m.group(5)) for m in lines]
    assert all(b >= a - SLACK for a, b in itertools.pairwise(printed)), printed
    assert len({m.group(1) for m in lines[: len(lines) // 2]}) == 3  # interleaved, not by node
    hosts = {int(m.group(2)): m.group(1) for m in lines}
    assert sorted(hosts) == list(range(6)) and all(m.group(2) == m.group(4) for m in lines)
    assert {hosts[r] for r in range(6)} == {"127.0.0.1", "127.0.0.2", "127.0.0.3"}
    for rank in range(6):
        assert [int(m.group(3)) for m in lines if m.group(2) == str(rank)] == list(range(TICKS))
    whole = logs(urls[0]).stdout.splitlines()
    assert not [line for line in whole if "last words" in line]  # still being written: held
    assert len(whole) == 3 * 2 * TICKS

    one = ticks(logs(urls[1], "--rank", "3").stdout)
    assert len(one) == TICKS and {m.group(2) for m in one} == {"3"}
    node = ticks(logs(urls[2], "--node", hosts[0]).stdout)
    assert {m.group(1) for m in node} == {hosts[0]} and len(node) == 2 * TICKS
    assert ticks(logs(urls[0], "--since", "0s").stdout) == []

    with subprocess.Popen(
        [sys.executable, "-m", "agentd", "logs", urls[1], "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as follow:
        try:
            assert follow.stdout is not None
            seen = [follow.stdout.readline() for _ in range(3 * 2 * TICKS)]
            assert len(ticks("".join(seen))) == 3 * 2 * TICKS
        finally:
            follow.send_signal(signal.SIGINT)
            assert follow.wait(30) == 0

    try:
        urllib.request.urlopen(urls[0] + "/logs", timeout=5)
        raise AssertionError("GET /logs without the token answered")
    except urllib.error.HTTPError as exc:
        assert exc.code == 401 and b"needs the bearer token" in exc.read()
    stop.touch()
    for agent in agents:
        assert agent.wait(30) == 0, agent.stderr()[-3000:]


def test_a_node_whose_lines_cannot_be_read_is_named_once(run_agentd, tmp_path):
    """Without --tee or --redirects a node keeps no files; with a log specs plugin its
    files are where the plugin put them: ``agentd logs`` says which, on stderr."""
    stop = tmp_path / "stop"
    work = [WORKER, "ticks", "--code", "2", "--stop-file", str(stop)]
    plain = run_agentd("--standalone", "--health-port", "0", *work)
    env = {"PYTHONPATH": flat_logs_installed(tmp_path / "site")}
    placed = run_agentd(
        "--standalone", "--health-port", "0", "--logs-specs", "flat", *work, env=env
    )
    for agent, note in (
        (plain, "keeps no log files: its agent writes them with --tee 3"),
        (placed, "workers write their output where FlatLogs.reify puts it (--logs-specs)"),
    ):
        found = wait_until(
            lambda a=agent: re.search(r"Health endpoint on (http://\S+)", a.stderr()), 30
        )
        answer = logs(found.group(1))
        assert answer.returncode == 0 and answer.stdout == "", answer
        assert answer.stderr.count(note) == 1, answer.stderr
    stop.touch()
    for agent in (plain, placed):
        assert agent.wait(30) == 0, agent.stderr()[-3000:]


class Follower:
    """``agentd logs --follow`` of an agent's endpoint, its output in files (read while
    it runs), killed at the end of the test if it did not end by itself."""

    def __init__(self, agent, tmp_path: Path) -> None:
        found = wait_until(
            lambda: re.search(r"Health endpoint on (http://\S+)", agent.stderr()), 30
        )
        self.out, self.err = tmp_path / "follow.out", tmp_path / "follow.err"
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentd", "logs", found.group(1), "--follow"],
                stdout=out,
                stderr=err,
            )
        wait_until(lambda: "tick 0 of rank" in self.out.read_text(), 30, what="a first line")

    def __enter__(self) -> Follower:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def ended(self) -> tuple[int, str, str]:
        """Its exit code and output, once it ended by itself."""
        return self.proc.wait(60), self.out.read_text(), self.err.read_text()


def test_a_follower_prints_every_line_and_ends_with_the_job(run_agentd, tmp_path):
    """The job's end used to close the endpoint under the follower: the lines of its last
    second, and a last line without a newline, were lost, and it exited 3 ("cannot
    reach"). The agent's end now waits for it to read them, and it exits 0."""
    stop = tmp_path / "stop"
    work = [WORKER, "ticks", "--code", "5", "--after", "0.05", "--stop-file", str(stop)]
    agent = run_agentd(
        "--standalone", "--nproc-per-node", "2", "--tee", "3", "--health-port", "0", *work
    )
    with Follower(agent, tmp_path) as follow:
        stop.touch()  # the workers end at once, their last line unfinished
        code, out, err = follow.ended()
    assert code == 0 and err == "", err
    assert agent.wait(30) == 0, agent.stderr()[-3000:]
    lines = re.findall(r":(\d) a0\| tick (\d) of rank \1 at", out)
    for rank in ("0", "1"):
        assert [int(tick) for r, tick in lines if r == rank] == list(range(5)), out
    assert out.count("a0| last words without a newline") == 2, out


def test_a_follower_names_an_agent_gone_without_an_end_and_exits_3(run_agentd, tmp_path):
    stop = tmp_path / "stop"
    work = [WORKER, "ticks", "--code", "2", "--stop-file", str(stop)]
    agent = run_agentd("--standalone", "--tee", "3", "--health-port", "0", *work)
    with Follower(agent, tmp_path) as follow:
        agent.proc.kill()
        code, out, err = follow.ended()
    assert code == 3, (out, err)
    assert re.fullmatch(
        r"agentd: error: cannot reach \S+'s agent at http://\S+: .*: no more of its lines "
        r"are shown\n",
        err,
    ), err


def test_a_follower_follows_a_node_that_joins_the_round(run_agentd, run_store, tmp_path):
    """The round's nodes were read once, as the follower began: a node that joined later
    (an elastic job growing, a spare in a lost node's place) was never shown."""
    store = run_store()
    stop = tmp_path / "stop"
    env = {"AGENTD_STORE_TOKEN": TOKEN}
    rdzv = agent_args(store.endpoint, "1:2", conf=STEADY_MEMBER)
    job = ["--tee", "3", "--health-port", "0"]
    work = [WORKER, "ticks", "--code", "3", "--after", "0.05", "--stop-file", str(stop)]
    first = run_agentd(*rdzv, "--local-addr", "127.0.0.1", *job, *work, env=env)
    with Follower(first, tmp_path) as follow:
        second = run_agentd(*rdzv, "--local-addr", "127.0.0.2", *job, *work, env=env)
        wait_until(
            lambda: re.search(r"127\.0\.0\.2:\d a0\| tick 2 of", follow.out.read_text()),
            60,
            what="the joined node's lines (its agent's first attempt)",
        )
        stop.touch()
        code, out, err = follow.ended()
    assert code == 0 and err == "agentd: 127.0.0.2 joined the round: its lines follow\n", err
    assert re.search(r"127\.0\.0\.1:\d a1\| tick 2 of", out)  # the first node's, restarted
    assert [a.wait(30) for a in (first, second)] == [0, 0]


def test_a_finished_runs_folders_are_read_from_disk(run_agentd, tmp_path):
    """``agentd logs`` asked the agents, so a job that had ended (a failure's post-mortem)
    had no merged view: ``--dir`` reads the run's folder, and on a filesystem several hosts
    share, the other hosts' folders beside it (``<run id>.<host>``, made here by hand from
    this host's: one host cannot make another's)."""
    log_dir = tmp_path / "logs"
    job = ["--standalone", "--nproc-per-node", "2", "--tee", "3", "--log-dir", str(log_dir)]
    agent = run_agentd(*job, WORKER, "ticks", "--code", "3", "--after", "0.05", log_dir=False)
    assert agent.wait(60) == 0, agent.stderr()[-3000:]
    [run] = [p for p in log_dir.iterdir() if p.is_dir()]
    other = log_dir / f"{run.name}.node2"
    shutil.copytree(run, other)
    (other / ".host").write_text("node2\n")
    another_run = log_dir / f"{run.name}.v2"  # a run of its own, by a host of another name
    shutil.copytree(run, another_run)
    (another_run / ".host").write_text("node9\n")

    answer = logs("--dir", str(run))
    assert answer.returncode == 0 and answer.stderr == "", answer
    host = (run / ".host").read_text().strip()
    lines = re.findall(r"(\S+):(\d) a0\| tick (\d) of rank \2 at ([\d.]+)", answer.stdout)
    assert sorted((h, r, int(t)) for h, r, t, _ in lines) == sorted(
        (h, r, t) for h in (host, "node2") for r in "01" for t in range(3)
    )
    printed = [float(at) for *_, at in lines]  # merged by when the agent read each line:
    assert all(b >= a - SLACK for a, b in itertools.pairwise(printed)), printed  # as above
    assert answer.stdout.count("a0| last words without a newline") == 4  # the files' ends

    one = logs("--dir", str(run / "attempt_0"), "--node", "node2", "--rank", "1")
    assert one.returncode == 0 and one.stdout.splitlines() == [
        line for line in answer.stdout.splitlines() if line.startswith("node2:1 ")
    ], one
    wrong = logs("--dir", str(log_dir))
    assert wrong.returncode == 2 and wrong.stderr == (
        f"agentd: error: --dir: {str(log_dir)!r} is a log directory: give the folder of one "
        f"of its runs ({run})\n"
    ), wrong
    assert logs("--dir", str(run), "--follow").returncode == 2
    empty = logs("--dir", "")  # not the working directory
    assert empty.stderr == "agentd: error: --dir: '' is not a directory\n", empty


def test_a_failure_report_says_how_to_read_every_ranks_output(run_agentd, tmp_path):
    """The report names the root cause's last lines; every rank's output is in the run's
    folder, and the report now says how to read it merged (only where the agent kept
    it in files)."""
    log_dir = tmp_path / "logs"
    job = ["--standalone", "--nproc-per-node", "2", "--log-dir", str(log_dir)]
    crash = [WORKER, "crash", "--rank", "1", "--code", "3"]
    kept = run_agentd(*job, "--tee", "3", *crash, log_dir=False)
    assert kept.wait(60) == 1
    found = re.search(r"Every rank's output, merged: agentd logs --dir (\S+)\n", kept.stderr())
    assert found, kept.stderr()[-3000:]
    answer = logs("--dir", found.group(1))
    assert answer.returncode == 0 and answer.stderr == "", answer
    assert re.search(r"^\S+:1 a0\| rank 1 crashing with 3$", answer.stdout, re.M), answer
    unkept = run_agentd(*job, *crash, log_dir=False)
    assert unkept.wait(60) == 1 and "FAILED" in unkept.stderr()
    assert "agentd logs --dir" not in unkept.stderr()
