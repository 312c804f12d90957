"""The push helpers against a real `coloc serve` with the observer's push source on: a good
value is taken, a bad one is refused with the server's reason, and the pusher pushes every N
steps the work per second it counted."""

import pytest

from coloc_client import PushError, ThroughputPusher, push_throughput

from conftest import running_server, server_env, wait_until_serving, OPERATOR_TOKEN
from coloc_client import Advisor


@pytest.fixture(scope="module")
def push_server(coloc_bin, tmp_path_factory):
    work = tmp_path_factory.mktemp("push")
    env = server_env(work, COLOC__OBSERVER__SOURCES="push")
    database = f"sqlite://{work / 'coloc.db'}"
    with running_server(coloc_bin, work, env, database) as (addr, proc, log):
        wait_until_serving(lambda: Advisor(addr, token=OPERATOR_TOKEN), proc, log)
        yield env["COLOC__METRICS__LISTEN"]


def test_a_good_value_is_taken_and_a_bad_one_refused_with_its_reason(push_server):
    push_throughput(push_server, "pod-1", 12.5)
    with pytest.raises(PushError) as refused:
        push_throughput(push_server, "pod-1", -3.0)
    assert refused.value.status == 400
    assert "throughput must be a finite number >= 0" in refused.value.reason
    with pytest.raises(PushError) as refused:
        push_throughput(push_server, "", 1.0)
    assert "pod_uid must be 1 to 256 characters" in refused.value.reason


def test_the_pusher_pushes_every_n_steps_the_work_per_second(push_server):
    times = iter([0.0, 2.0, 5.0])
    errors = []
    pusher = ThroughputPusher(push_server, pod_uid="pod-2", every=4, on_error=errors.append,
                              clock=lambda: next(times))
    pushed = [pusher.step(8) for _ in range(8)]
    # 4 steps of 8 samples in 2 s, then 4 more in 3 s.
    assert pushed == [None, None, None, 16.0, None, None, None, 32 / 3]
    assert errors == []
