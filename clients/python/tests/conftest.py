"""Starts a real `coloc serve` (the binary cargo built) on a free loopback port, on a fresh
SQLite file seeded with `coloc import kace ../shared/data/kace-v100`, with auth on: an operator
token and a reader token. COLOC_BIN overrides the binary (default target/debug/coloc)."""

import contextlib
import os
import pathlib
import socket
import subprocess
import time

import pytest

from coloc_client import Advisor, AdvisorError

REPO = pathlib.Path(__file__).resolve().parents[3]
KACE = REPO.parent / "shared" / "data" / "kace-v100"
OPERATOR_TOKEN = "operator-token-for-the-python-tests"
READER_TOKEN = "reader-token-for-the-python-tests"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def coloc_bin() -> pathlib.Path:
    path = pathlib.Path(os.environ.get("COLOC_BIN", REPO / "target" / "debug" / "coloc"))
    if not path.is_file():
        pytest.fail(f"{path} not found: build it first (cargo build) or set COLOC_BIN")
    return path


@contextlib.contextmanager
def running_server(coloc_bin, work: pathlib.Path, env: dict, database: str):
    """Runs `coloc serve` on a free loopback port; yields (address, process, log path) and
    stops the server on exit."""
    addr = f"127.0.0.1:{_free_port()}"
    log_path = work / "serve.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen([coloc_bin, "serve", "--listen", addr, "--database", database], env=env,
                                stdout=log, stderr=subprocess.STDOUT)
        try:
            yield addr, proc, log_path
        finally:
            proc.terminate()
            proc.wait(timeout=30)


def wait_until_serving(make_advisor, proc, log_path: pathlib.Path):
    """Calls ListWorkloads until the server answers (30 s at most)."""
    deadline = time.monotonic() + 30
    with make_advisor() as probe:
        while True:
            try:
                probe.workloads()
                return
            except AdvisorError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("coloc serve did not come up:\n" + log_path.read_text())
                time.sleep(0.1)


def server_env(work: pathlib.Path, **settings) -> dict:
    """The environment of a test server: metrics on a free port, auth on with the test tokens."""
    tokens = work / "tokens"
    tokens.write_text(f"operator {OPERATOR_TOKEN}\nreader {READER_TOKEN}\n")
    env = dict(os.environ, COLOC__METRICS__LISTEN=f"127.0.0.1:{_free_port()}", COLOC__AUTH__TOKENS_FILE=str(tokens))
    env.update(settings)
    return env


@pytest.fixture(scope="session")
def server(coloc_bin, tmp_path_factory):
    """The address of a seeded, running coloc server; stopped at the end of the session."""
    if not KACE.is_dir():
        pytest.fail(f"missing {KACE} (the KACE V100 measurements)")
    work = tmp_path_factory.mktemp("coloc")
    database = f"sqlite://{work / 'coloc.db'}"
    env = server_env(work)
    subprocess.run([coloc_bin, "import", "kace", KACE, "--gpu", "Tesla V100-SXM2-32GB",
                    "--gpu-memory-gb", "32", "--database", database], env=env, check=True,
                   stdout=subprocess.DEVNULL)
    with running_server(coloc_bin, work, env, database) as (addr, proc, log_path):
        wait_until_serving(lambda: Advisor(addr, token=READER_TOKEN, timeout=2), proc, log_path)
        yield addr


@pytest.fixture
def advisor(server):
    """An Advisor with the operator token."""
    with Advisor(server, token=OPERATOR_TOKEN) as a:
        yield a
