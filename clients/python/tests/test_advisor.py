"""The wrapper against a real coloc serve seeded with the KACE V100 data (conftest.py)."""

import datetime as dt
import hashlib

import grpc
import pytest

from coloc_client import Advisor, AdvisorError, PROTO_PACKAGE, PROTO_SHA256, __version__, pb

from conftest import READER_TOKEN, REPO

# Place as it answered before policies (no rule, point predictions, losses listed): these
# tests are about the GPUs given and the occupancy, not the default policy.
OPEN_POLICY = pb.Policy(rule=pb.PLACE_RULE_NONE, cautious=False, include_losses=True)

V100 = "Tesla V100-SXM2-32GB"
BERT = "bert-base-cased_batch8-inf"
WAV2VEC = "wav2vec2-base-960h_batch2-inf"


def test_the_stubs_come_from_this_repositorys_proto_and_the_version_follows_it():
    proto = REPO / "proto" / "coloc" / "v1" / "advisor.proto"
    assert PROTO_SHA256 == hashlib.sha256(proto.read_bytes()).hexdigest()
    assert PROTO_PACKAGE == "coloc.v1"
    assert __version__.split(".")[0] == PROTO_PACKAGE.rsplit(".v", 1)[1]


def test_rank_orders_partners_by_the_default_objective(advisor):
    answer = advisor.rank(BERT, top_k=3)
    assert answer.gpu == V100 and answer.model_version >= 1
    assert answer.objective == pb.NORMALIZED_SUM
    assert 1 <= len(answer.ranked) <= 3
    sums = [c.predicted_normalized_sum for c in answer.ranked]
    assert sums == sorted(sums, reverse=True)
    assert all(c.members[0].workload == BERT for c in answer.ranked)


def test_rank_takes_the_objective_by_name(advisor):
    # Ordered on the point predictions: the default policy is cautious and orders on the low
    # ends of the intervals instead.
    answer = advisor.rank(
        BERT,
        objective="throughput_sum",
        include_below_break_even=True,
        policy=pb.Policy(cautious=False),
    )
    assert answer.objective == pb.THROUGHPUT_SUM
    assert not answer.policy.cautious
    sums = [c.predicted_throughput_sum for c in answer.ranked]
    assert sums == sorted(sums, reverse=True) and len(sums) > 3
    with pytest.raises(ValueError):
        advisor.rank(BERT, objective="fastest")


def test_other_request_fields_pass_by_their_proto_names(advisor):
    capped = advisor.rank(BERT, max_target_slowdown=0.9, min_target_speed_fraction=0.9, include_below_break_even=True)
    assert all(c.members[0].predicted_speed_fraction >= 0.9 for c in capped.ranked)
    assert any(s.code == pb.TARGET_SLOWDOWN for s in capped.skipped)
    with pytest.raises(ValueError):
        advisor.rank(BERT, no_such_field=1)


def test_predict_answers_each_member_in_order(advisor):
    answer = advisor.predict([WAV2VEC, BERT])
    assert [m.workload for m in answer.members] == [WAV2VEC, BERT]
    assert answer.predicted_throughput_sum > 0


def test_an_invalid_request_raises_with_the_code_and_the_field(advisor):
    with pytest.raises(AdvisorError) as raised:
        advisor.rank(BERT, min_target_speed_fraction=1.5)
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.field == "min_target_speed_fraction"
    assert "min_target_speed_fraction" in str(raised.value)


def test_an_unknown_workload_is_not_found(advisor):
    with pytest.raises(AdvisorError) as raised:
        advisor.rank("no-such-workload")
    assert raised.value.code == grpc.StatusCode.NOT_FOUND
    assert raised.value.field_violations == []


def test_the_token_is_sent_and_its_role_checked(server):
    with Advisor(server) as anonymous:
        with pytest.raises(AdvisorError) as raised:
            anonymous.rank(BERT)
        assert raised.value.code == grpc.StatusCode.UNAUTHENTICATED
    with Advisor(server, token=READER_TOKEN) as reader:
        assert reader.rank(BERT, top_k=1).ranked
        with pytest.raises(AdvisorError) as raised:
            reader.report({BERT: 50.0, WAV2VEC: 20.0})
        assert raised.value.code == grpc.StatusCode.PERMISSION_DENIED


def test_place_scores_the_given_gpus_best_first_and_names_those_left_out(advisor):
    gpus = [
        {"id": "t-empty", "node": "n1"},
        pb.GpuState(id="t-shared", node="n1", residents=[WAV2VEC]),
        {"id": "t-full", "node": "n2", "residents": [WAV2VEC, WAV2VEC]},
    ]
    answer = advisor.place(BERT, gpus, max_jobs_per_gpu=2, policy=OPEN_POLICY)
    assert answer.policy.rule == pb.PLACE_RULE_NONE and answer.policy.include_losses
    placed = [p.gpu_id for p in answer.placements]
    assert sorted(placed) == ["t-empty", "t-shared"]
    gains = [p.gain for p in answer.placements]
    assert gains == sorted(gains, reverse=True)
    assert [(s.gpu_id, s.code) for s in answer.skipped] == [("t-full", pb.PLACE_TOO_MANY_JOBS)]
    shared = next(p for p in answer.placements if p.gpu_id == "t-shared")
    assert [m.workload for m in shared.members] == [BERT, WAV2VEC]


def test_assign_feeds_places_occupancy_and_release_forgets(advisor):
    created = advisor.assign("t-job-1", "t-occ-0", WAV2VEC, node="t-occ-node", lease_secs=600)
    assert created.created and created.gpu == V100 and created.expires_at.seconds > 0
    assert not advisor.assign("t-job-1", "t-occ-0", WAV2VEC, node="t-occ-node", lease_secs=600).created
    with pytest.raises(AdvisorError) as raised:
        advisor.assign("t-job-1", "t-occ-1", WAV2VEC, node="t-occ-node")
    assert raised.value.code == grpc.StatusCode.ALREADY_EXISTS
    [gpu] = advisor.gpus(nodes=["t-occ-node"])
    assert gpu.id == "t-occ-0" and [j.job_id for j in gpu.jobs] == ["t-job-1"]
    answer = advisor.place(BERT, nodes=["t-occ-node"], policy=OPEN_POLICY)
    assert [p.gpu_id for p in answer.placements] == ["t-occ-0"]
    assert [m.workload for m in answer.placements[0].members] == [BERT, WAV2VEC]
    assert advisor.release("t-job-1").released
    assert not advisor.release("t-job-1").released
    assert advisor.gpus(nodes=["t-occ-node"])[0].jobs == []


def test_report_stores_a_run_once(advisor):
    at = dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.timezone.utc)
    first = advisor.report([(BERT, 55.5, "t-r1"), (BERT, 57.5, "t-r2")], observed_at=at)
    assert first.created and first.observation_id > 0
    again = advisor.report([(BERT, 55.5, "t-r1"), (BERT, 57.5, "t-r2")], observed_at=at)
    assert not again.created and again.observation_id == first.observation_id
    with pytest.raises(AdvisorError) as raised:
        advisor.report({BERT: 55.5})
    assert raised.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert raised.value.field == "members"
