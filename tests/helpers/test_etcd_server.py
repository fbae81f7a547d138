"""The etcd test fixture itself: a member that loses its port is retried, and a member that
exits for any other reason fails the start loudly, naming it and quoting its log."""

from __future__ import annotations

import socket

import pytest

from tests.helpers.etcd_server import EtcdCluster, MemberExited, require_etcd


def test_a_member_whose_port_was_taken_is_started_again_on_new_ports(tmp_path):
    require_etcd()
    cluster = EtcdCluster(tmp_path / "c", size=3)
    taken = cluster.members[1].client_port
    with socket.socket() as squatter:  # what another process did between free_port and bind
        squatter.bind(("127.0.0.1", taken))
        squatter.listen()
        with cluster:
            assert cluster.members[1].client_port != taken
            assert all(m.proc is not None and m.proc.poll() is None for m in cluster.members)


def test_a_member_that_exits_for_another_reason_is_named_with_its_log(tmp_path):
    require_etcd()
    cluster = EtcdCluster(tmp_path / "c", size=1, extra_args=("--no-such-flag",))
    with pytest.raises(MemberExited, match=r"etcd m0 .* exited with \d+; its log .*no-such-flag"):
        cluster.start()
    assert all(m.proc is None or m.proc.poll() is not None for m in cluster.members)
