"""``agentd logs`` with real agents (issue 50): three nodes on 127.0.0.1-3 with two ranks
each, every rank printing lines that carry the time they were printed; the command asked
of one agent prints every node's lines, prefixed ``host:rank aN|``, in time order, whole."""

from __future__ import annotations

import itertools
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request

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


def logs(url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "agentd", "logs", url, *extra]
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


def _followed(agent) -> tuple[subprocess.Popen[str], str]:
    """``agentd logs --follow`` of ``agent``'s endpoint, and the first line it printed."""
    found = wait_until(lambda: re.search(r"Health endpoint on (http://\S+)", agent.stderr()), 30)
    follow = subprocess.Popen(
        [sys.executable, "-m", "agentd", "logs", found.group(1), "--follow"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert follow.stdout is not None
    first = follow.stdout.readline()
    assert "tick 0 of rank" in first, first
    return follow, first


def _rest(follow: subprocess.Popen[str]) -> tuple[str, str]:
    """What the follower printed after its first line, once it ended by itself (read
    through its pipes' own buffers: ``communicate`` would skip what ``readline`` had
    buffered)."""
    follow.wait(60)
    assert follow.stdout is not None and follow.stderr is not None
    return follow.stdout.read(), follow.stderr.read()


def test_a_follower_prints_every_line_and_ends_with_the_job(run_agentd, tmp_path):
    """The job's end used to close the endpoint under the follower: the lines of its last
    second, and a last line without a newline, were lost, and it exited 3 ("cannot
    reach"). The agent's end now waits for it to read them, and it exits 0."""
    stop = tmp_path / "stop"
    work = [WORKER, "ticks", "--code", "5", "--after", "0.05", "--stop-file", str(stop)]
    agent = run_agentd(
        "--standalone", "--nproc-per-node", "2", "--tee", "3", "--health-port", "0", *work
    )
    follow, first = _followed(agent)
    with follow:
        stop.touch()  # the workers end at once, their last line unfinished
        out, err = _rest(follow)
    assert follow.returncode == 0 and err == "", err
    assert agent.wait(30) == 0, agent.stderr()[-3000:]
    lines = re.findall(r":(\d) a0\| tick (\d) of rank \1 at", first + out)
    for rank in ("0", "1"):
        assert [int(tick) for r, tick in lines if r == rank] == list(range(5)), first + out
    assert out.count("a0| last words without a newline") == 2, out


def test_a_follower_names_an_agent_gone_without_an_end_and_exits_3(run_agentd, tmp_path):
    stop = tmp_path / "stop"
    work = [WORKER, "ticks", "--code", "2", "--stop-file", str(stop)]
    agent = run_agentd("--standalone", "--tee", "3", "--health-port", "0", *work)
    follow, _ = _followed(agent)
    with follow:
        agent.proc.kill()
        out, err = _rest(follow)
    assert follow.returncode == 3, (out, err)
    assert re.fullmatch(
        r"agentd: error: cannot reach \S+'s agent at http://\S+: .*: no more of its lines "
        r"are shown\n",
        err,
    ), err
