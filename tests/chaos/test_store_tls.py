"""TLS for the embedded store, its standby candidates and ``agentd store`` (issue 36): the
bearer token never crosses the network in clear, every node proves itself with a
certificate of the job's CA, and bad files are refused before anything starts.
Certificates are made at test time (tests/helpers/tls.py)."""

from __future__ import annotations

import json
import socket
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from tests.chaos.test_store_standby import FAST, kill_the_host_and_wait_for_two, standing_by
from tests.conftest import free_port, wait_until
from tests.helpers.jobs import TOKEN, member_job, one_round
from tests.helpers.tls import NodeTls, make_ca, node_tls


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> dict[str, NodeTls]:
    """The job's CA and three nodes; a stranger signed by another CA; an expired node."""
    folder = tmp_path_factory.mktemp("tls")
    ca = make_ca(folder)
    made = {name: node_tls(folder, name, ca) for name in ("n0", "n1", "n2")}
    made["stranger"] = node_tls(folder, "stranger", make_ca(folder, "other"))
    made["expired"] = node_tls(folder, "expired", ca, days=-1)
    return made


def status(agent) -> dict:
    with urllib.request.urlopen(f"http://127.0.0.1:{agent.health}/status", timeout=5) as answer:
        return json.load(answer)


def tls_agent(run_agentd, endpoint, stop, tls: NodeTls, index: int, *extra: str):
    health = free_port()
    agent = run_agentd(
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        endpoint,
        "--rdzv-id",
        "job",
        "--nnodes",
        "2:3",
        "--rdzv-conf",
        f"{FAST},{tls.conf()}",
        "--local-addr",
        f"127.0.0.{index + 1}",
        "--health-port",
        str(health),
        *extra,
        *member_job(stop),
        env={"AGENTD_STORE_TOKEN": TOKEN},
    )
    agent.health = health
    return agent


GET_WITH_TOKEN = (
    b"POST /v1/get HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
    + TOKEN.encode()
    + b"\r\nContent-Length: 26\r\n\r\n"
    + b'{"key": "k", "timeout": 0}'
)
"""A store request with the right token: what a reader of the wire could send."""


def plain_request(port: int) -> bytes:
    """:data:`GET_WITH_TOKEN` in plain HTTP; the answer's first bytes (b"": none)."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as conn:
        conn.sendall(GET_WITH_TOKEN)
        try:
            return conn.recv(4096)
        except ConnectionResetError:
            return b""


def tls_request(port: int, tls: NodeTls, trusting: Path) -> bytes:
    """:data:`GET_WITH_TOKEN` over TLS, presenting ``tls``'s certificate; the answer's
    first bytes (b"": the handshake or the connection failed)."""
    context = ssl.create_default_context(cafile=str(trusting))
    context.load_cert_chain(str(tls.cert), str(tls.key))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as conn:
                conn.sendall(GET_WITH_TOKEN)
                return conn.recv(4096)
        except (ssl.SSLError, ConnectionResetError):
            return b""


def test_three_agents_over_mutual_tls_survive_the_loss_of_the_store_host(
    run_agentd, tmp_path, certs
):
    port = free_port()
    endpoint = f"127.0.0.1:{port}"
    stop = tmp_path / "stop"
    agents = []
    for index in range(3):
        agents.append(tls_agent(run_agentd, endpoint, stop, certs[f"n{index}"], index))
        if index == 0:
            wait_until(
                lambda: "Store listening on https://" in agents[0].stderr(),
                what="the first agent to host the store over TLS",
            )
    wait_until(lambda: one_round(agents, 3), what="a job of three")
    host, survivors = agents[0], agents[1:]
    wait_until(lambda: all(standing_by(a) for a in survivors), what="both to stand by")
    for agent in survivors:  # the candidates serve TLS too
        assert "Store listening on https://" in agent.stderr(), agent.stderr()[-2000:]
    # the token alone, in clear, opens nothing: the store speaks TLS only
    assert not plain_request(port).startswith(b"HTTP/1.1 200")
    kill_the_host_and_wait_for_two(host, survivors)
    shown = status(survivors[0])["store"]
    assert shown["serving"] != endpoint and shown["term"] == 2 and shown["tls"], shown
    stop.touch()
    assert [a.wait(30) for a in survivors] == [0, 0], [a.stderr()[-2000:] for a in survivors]
    for agent in agents:
        assert "crosses the network in clear" not in agent.stderr()


@pytest.fixture
def tls_store(run_store, certs):
    """``agentd store`` over mutual TLS with node n0's certificate: its port and log."""
    store = run_store(token=TOKEN, args=certs["n0"].flags())
    assert "Store listening on https://" in store.err.read_text()
    return store.port, store.err


def client_agent(run_agentd, port: int, stop: Path, conf: str):
    return run_agentd(
        "--rdzv-backend",
        "c10d",
        "--rdzv-endpoint",
        f"127.0.0.1:{port}",
        "--rdzv-id",
        "job",
        "--nnodes",
        "1",
        "--rdzv-conf",
        f"{FAST},is_host=0,standby=0,{conf}",
        *member_job(stop),
        env={"AGENTD_STORE_TOKEN": TOKEN},
    )


def test_agentd_store_over_tls_serves_its_jobs_nodes_and_refuses_others(
    run_agentd, tmp_path, tls_store, certs
):
    port, err = tls_store
    stop = tmp_path / "stop"
    stop.touch()  # the member job ends at once: a round and its exit are enough
    member = client_agent(run_agentd, port, stop, certs["n1"].conf())
    assert member.wait(60) == 0, member.stderr()[-3000:]
    # another CA's certificate: the agent names the store and the reason, in one line
    stranger = client_agent(run_agentd, port, stop, certs["stranger"].conf())
    assert stranger.wait(60) == 3, stranger.stderr()[-3000:]
    said = [line for line in stranger.stderr().splitlines() if "TLS handshake failed" in line]
    assert said and f"127.0.0.1:{port}" in said[0], stranger.stderr()[-3000:]
    assert "Traceback" not in stranger.stderr()
    # a client that trusts the store but holds another CA's certificate: the store refuses
    # it, in one line, never a traceback
    assert not tls_request(port, certs["stranger"], trusting=certs["n0"].ca).startswith(
        b"HTTP/1.1 200"
    )
    wait_until(lambda: "refused a TLS handshake" in err.read_text(), what="the refusal")
    store_log = err.read_text()
    assert store_log.count("refused a TLS handshake") == 1, store_log
    assert "Traceback" not in store_log


@pytest.mark.parametrize(
    ("case", "rule"),
    [
        ("missing", "no such file"),
        ("mismatch", "the key does not belong to the certificate"),
        ("expired", "certificate has expired"),
        ("stranger", "unable to get local issuer certificate"),
    ],
)
@pytest.mark.parametrize("command", ["run", "store"])
def test_bad_tls_files_are_exit_2_with_one_line(tmp_path, certs, case, rule, command):
    good = certs["n0"]
    cert, key = {
        "missing": (tmp_path / "nope.pem", good.key),
        "mismatch": (good.cert, certs["n1"].key),
        "expired": (certs["expired"].cert, certs["expired"].key),
        "stranger": (certs["stranger"].cert, certs["stranger"].key),
    }[case]
    port = free_port()
    if command == "store":
        args = [
            "store",
            "--port",
            str(port),
            "--cacert",
            str(good.ca),
            "--cert",
            str(cert),
            "--key",
            str(key),
        ]
    else:
        conf = f"protocol=https,cacert={good.ca},cert={cert},key={key}"
        args = [
            "run",
            "--rdzv-backend",
            "c10d",
            "--rdzv-endpoint",
            f"127.0.0.1:{port}",
            "--nnodes",
            "1",
            "--rdzv-conf",
            conf,
            "-m",
            "json.tool",
        ]
    out = subprocess.run(
        [sys.executable, "-m", "agentd", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={"AGENTD_STORE_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and rule in lines[0], lines
    assert ("--cert" if command == "store" else "cert=") in lines[0]


def test_a_token_sent_off_loopback_without_tls_is_one_warning(tmp_path):
    """``agentd store`` bound to every address, with a token and no TLS, says once that the
    token crosses the network in clear."""
    err = tmp_path / "store.err"
    with open(err, "wb") as fp:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "agentd",
                "store",
                "--host",
                "0.0.0.0",
                "--port",
                str(free_port()),
            ],
            stderr=fp,
            stdout=subprocess.DEVNULL,
            env={"AGENTD_STORE_TOKEN": TOKEN, "PATH": "/usr/bin:/bin"},
        )
    try:
        wait_until(lambda: "Store listening" in err.read_text(), what="the store")
    finally:
        proc.terminate()
        proc.wait(30)
    assert err.read_text().count("crosses the network in clear text") == 1, err.read_text()
