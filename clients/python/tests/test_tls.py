"""Advisor(ca_cert=...) against a real coloc serve with TLS on (a certificate made with openssl)."""

import os
import shutil
import subprocess

import grpc
import pytest

from coloc_client import Advisor, AdvisorError

from conftest import OPERATOR_TOKEN, running_server, server_env, wait_until_serving


def _self_signed(work, name):
    key, cert = work / f"{name}.key", work / f"{name}.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=localhost",
         "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-keyout", key, "-out", cert],
        check=True, capture_output=True,
    )
    return key, cert


def test_ca_cert_turns_tls_on_and_a_wrong_one_is_refused(coloc_bin, tmp_path):
    if shutil.which("openssl") is None:
        # CI (.ci/run) installs openssl: there a missing one fails the run instead of passing it.
        if os.environ.get("CI", "") not in ("", "false"):
            pytest.fail("openssl is not installed: CI must provide it (.ci/run installs it)")
        pytest.skip("openssl is not installed")
    key, cert = _self_signed(tmp_path, "server")
    _, other = _self_signed(tmp_path, "other")
    env = server_env(tmp_path, COLOC__SERVER__TLS_CERT_FILE=str(cert), COLOC__SERVER__TLS_KEY_FILE=str(key))
    database = f"sqlite://{tmp_path / 'tls.db'}"
    with running_server(coloc_bin, tmp_path, env, database) as (addr, proc, log_path):
        wait_until_serving(lambda: Advisor(addr, token=OPERATOR_TOKEN, ca_cert=str(cert), timeout=2), proc, log_path)
        with Advisor(addr, token=OPERATOR_TOKEN, ca_cert=cert.read_bytes()) as advisor:
            assert advisor.workloads() == []
        for wrong in (Advisor(addr, token=OPERATOR_TOKEN, ca_cert=str(other), timeout=2),
                      Advisor(addr, token=OPERATOR_TOKEN, timeout=2)):
            with wrong, pytest.raises(AdvisorError) as raised:
                wrong.workloads()
            assert raised.value.code == grpc.StatusCode.UNAVAILABLE
