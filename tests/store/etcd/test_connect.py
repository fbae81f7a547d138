"""``--rdzv-endpoint`` and ``--rdzv-conf`` for etcd: members, TLS, auth, each error one line."""

from __future__ import annotations

import pytest

from agentd.exceptions import ConfigError
from agentd.store.etcd.connect import etcd_settings
from agentd.store.etcd.gateway import prefix_end
from tests.helpers.etcd_server import make_tls


def test_members_default_port_and_prefix():
    conf = {"key_prefix": "/teams/ml/", "join_timeout": "5"}
    settings = etcd_settings("10.0.0.1, etcd-b:2380,[::1]", conf, env={})
    assert settings.urls == ("http://10.0.0.1:2379", "http://etcd-b:2380", "http://[::1]:2379")
    assert settings.key_prefix == "/teams/ml/" and settings.ssl_context is None
    assert conf == {"join_timeout": "5"}  # the rendezvous keys are left for the rendezvous


def test_a_scheme_in_the_endpoint_sets_the_protocol():
    assert etcd_settings("https://h:1/", {}, env={}).urls == ("https://h:1",)


def test_tls_files_make_https_and_torch_names_are_accepted(tmp_path):
    tls = make_tls(tmp_path)
    conf = {
        "ca_cert": str(tls.ca),
        "ssl_cert": str(tls.client_cert),
        "ssl_cert_key": str(tls.client_key),
    }
    settings = etcd_settings("h:1", conf, env={})
    assert settings.urls == ("https://h:1",) and settings.ssl_context is not None
    assert conf == {}


def test_password_from_the_environment():
    settings = etcd_settings("h", {"username": "u"}, env={"AGENTD_ETCD_PASSWORD": "pw"})
    assert (settings.username, settings.password) == ("u", "pw")


@pytest.mark.parametrize(
    ("endpoints", "conf", "message"),
    [
        ("h", {"protocol": "ftp"}, "--rdzv-conf: protocol='ftp' must be http or https"),
        ("ftp://h", {}, "--rdzv-endpoint: 'ftp://h' must be host:port or http(s)://host:port"),
        ("https://h", {"protocol": "http"}, "disagrees with --rdzv-conf protocol=http"),
        ("h:x", {}, "--rdzv-endpoint: 'h:x' has no valid port"),
        ("h", {"cacert": "/no/such.pem"}, "--rdzv-conf: cacert='/no/such.pem' must be a readable"),
        ("h", {"protocol": "http", "cacert": "/x"}, "cacert needs protocol=https"),
        ("h", {"protocol": "https", "key": "/x"}, "key='/x' needs cert="),
        ("h", {"username": "u"}, "username='u' needs password= (or AGENTD_ETCD_PASSWORD)"),
        ("h", {"password": "p"}, "--rdzv-conf: password needs username= too"),
    ],
)
def test_bad_values_are_one_config_error(endpoints, conf, message):
    with pytest.raises(ConfigError) as caught:
        etcd_settings(endpoints, conf, env={})
    assert message in str(caught.value) and "\n" not in str(caught.value)


def test_a_file_that_is_not_a_certificate(tmp_path):
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    with pytest.raises(ConfigError, match=r"cacert=.* is not a PEM CA bundle"):
        etcd_settings("h", {"cacert": str(junk)}, env={})
    with pytest.raises(ConfigError, match=r"cert=.* is not a PEM certificate and its key"):
        etcd_settings("h", {"protocol": "https", "cert": str(junk)}, env={})


def test_prefix_end():
    assert prefix_end(b"agentd/job/") == b"agentd/job0"
    assert prefix_end(b"a\xff\xff") == b"b"
    assert prefix_end(b"") == b"\0"
