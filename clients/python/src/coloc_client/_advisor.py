"""The Advisor wrapper: keyword arguments in, response messages out, errors as AdvisorError."""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass
from typing import Iterable, Mapping, Optional, Sequence, Tuple, Union

import grpc
from google.rpc import error_details_pb2, status_pb2

from ._proto import advisor_pb2 as pb
from ._proto import advisor_pb2_grpc as pb_grpc

ObjectiveLike = Union[str, int, None]
GpuLike = Union[pb.GpuState, Mapping[str, object]]
MemberLike = Union[pb.ColocatedMember, Tuple[str, float], Tuple[str, float, str], Mapping[str, object]]


@dataclass(frozen=True)
class FieldViolation:
    """One field of a request the server refused (google.rpc.BadRequest.FieldViolation)."""

    field: str
    description: str


class AdvisorError(Exception):
    """A call the server answered with an error.

    ``code`` is the grpc.StatusCode, ``details`` the server's message, and ``field_violations``
    the google.rpc.BadRequest detail of an INVALID_ARGUMENT answer (empty otherwise); ``field``
    is the first violation's field, or None.
    """

    def __init__(self, code: grpc.StatusCode, details: str, field_violations: Sequence[FieldViolation] = ()):
        self.code = code
        self.details = details
        self.field_violations = list(field_violations)
        self.field: Optional[str] = self.field_violations[0].field if self.field_violations else None
        where = f" (field {self.field})" if self.field else ""
        super().__init__(f"{code.name}: {details}{where}")

    @classmethod
    def from_rpc_error(cls, error: grpc.RpcError) -> "AdvisorError":
        """Reads the status code, message and BadRequest detail of a failed call."""
        violations = []
        for key, value in error.trailing_metadata() or ():
            if key != "grpc-status-details-bin":
                continue
            status = status_pb2.Status.FromString(value)
            for detail in status.details:
                if detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                    bad = error_details_pb2.BadRequest()
                    detail.Unpack(bad)
                    violations += [FieldViolation(v.field, v.description) for v in bad.field_violations]
        return cls(error.code(), error.details() or "", violations)


def _objective(value: ObjectiveLike) -> Optional[int]:
    if value is None or isinstance(value, int):
        return value
    try:
        return pb.Objective.Value(value.upper())
    except ValueError:
        raise ValueError(f"unknown objective {value!r}: use 'normalized_sum' or 'throughput_sum'") from None


def _gpu_state(gpu: GpuLike) -> pb.GpuState:
    return gpu if isinstance(gpu, pb.GpuState) else pb.GpuState(**gpu)


def _member(member: MemberLike) -> pb.ColocatedMember:
    if isinstance(member, pb.ColocatedMember):
        return member
    if isinstance(member, Mapping):
        return pb.ColocatedMember(**member)
    return pb.ColocatedMember(workload=member[0], throughput=member[1], job_id=member[2] if len(member) > 2 else "")


class Advisor:
    """A connection to a coloc server.

    ``addr`` is host:port (an ``http://`` or ``https://`` prefix is accepted); ``token`` is sent
    as ``authorization: Bearer <token>`` on every call; ``ca_cert`` (PEM bytes or a file path)
    turns TLS on, as does an ``https://`` address (then with the system's roots).
    """

    def __init__(
        self,
        addr: str,
        token: Optional[str] = None,
        ca_cert: Union[bytes, str, None] = None,
        timeout: Optional[float] = 30.0,
    ):
        secure = addr.startswith("https://") or ca_cert is not None
        target = addr.split("://", 1)[-1].rstrip("/")
        if secure:
            if isinstance(ca_cert, str):
                with open(ca_cert, "rb") as f:
                    ca_cert = f.read()
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=ca_cert))
        else:
            self._channel = grpc.insecure_channel(target)
        self._stub = pb_grpc.ColocationAdvisorStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout = timeout

    def close(self) -> None:
        """Closes the channel."""
        self._channel.close()

    def __enter__(self) -> "Advisor":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request):
        try:
            return getattr(self._stub, method)(request, metadata=self._metadata, timeout=self._timeout)
        except grpc.RpcError as error:
            raise AdvisorError.from_rpc_error(error) from None

    def rank(
        self,
        target: str,
        candidates: Iterable[str] = (),
        *,
        top_k: int = 0,
        gpu: str = "",
        gpu_memory_gb: float = 0.0,
        objective: ObjectiveLike = None,
        min_target_speed_fraction: float = 0.0,
        min_benefit: float = 0.0,
        include_oversubscribed: bool = False,
        include_below_break_even: bool = False,
        **more,
    ) -> pb.RankResponse:
        """Ranks partners for ``target`` (Rank); objective unset = the server's default.

        ``more``: any other RankRequest field, by its proto name.
        """
        request = pb.RankRequest(
            target=target,
            candidates=list(candidates),
            top_k=top_k,
            gpu=gpu,
            gpu_memory_gb=gpu_memory_gb,
            min_target_speed_fraction=min_target_speed_fraction,
            min_benefit=min_benefit,
            include_oversubscribed=include_oversubscribed,
            include_below_break_even=include_below_break_even,
            **more,
        )
        if objective is not None:
            request.objective = _objective(objective)
        return self._call("Rank", request)

    def place(
        self,
        workload: str,
        gpus: Iterable[GpuLike] = (),
        *,
        objective: ObjectiveLike = None,
        min_job_fraction: float = 0.0,
        min_resident_fraction: float = 0.0,
        max_jobs_per_gpu: int = 0,
        top_k: int = 0,
        include_oversubscribed: bool = False,
        nodes: Iterable[str] = (),
        gpu: str = "",
        cautious: bool = False,
        **more,
    ) -> pb.PlaceResponse:
        """Scores GPUs for a new job of ``workload`` (Place), best first.

        ``gpus`` are GpuState messages or dicts of their fields (id, node, gpu, memory_gb,
        residents); empty = the occupancy coloc keeps (assign/release), filtered by nodes and gpu.
        objective unset = the server's default policy (settings [policy]: normalized sum,
        fair share, cautious; the answer's ``policy`` says what it applied); ``more``: any other
        PlaceRequest field, by its proto name (``policy=pb.Policy(...)``).
        """
        if objective is not None:
            more["objective"] = _objective(objective)
        return self._call(
            "Place",
            pb.PlaceRequest(
                workload=workload,
                gpus=[_gpu_state(g) for g in gpus],
                min_job_fraction=min_job_fraction,
                min_resident_fraction=min_resident_fraction,
                max_jobs_per_gpu=max_jobs_per_gpu,
                top_k=top_k,
                include_oversubscribed=include_oversubscribed,
                nodes=list(nodes),
                gpu=gpu,
                cautious=cautious,
                **more,
            ),
        )

    def predict(
        self, workloads: Sequence[str], *, gpu: str = "", gpu_memory_gb: float = 0.0, **more
    ) -> pb.PredictResponse:
        """Predicts an explicit set of 2 or more workloads (Predict); ``more``: any other
        PredictRequest field, by its proto name."""
        return self._call(
            "Predict", pb.PredictRequest(workloads=list(workloads), gpu=gpu, gpu_memory_gb=gpu_memory_gb, **more)
        )

    def report(
        self,
        members: Union[Mapping[str, float], Iterable[MemberLike]],
        *,
        gpu: str = "",
        gpu_id: str = "",
        observed_at: Optional[_dt.datetime] = None,
        sharing_mode: Optional[str] = None,
    ) -> pb.ReportColocationResponse:
        """Reports a colocated run (ReportColocation).

        ``members`` is {workload: throughput}, or (workload, throughput[, job_id]) tuples,
        ColocatedMember messages or dicts (two copies of one workload need the tuple form).
        ``sharing_mode`` is how the GPU was shared: "SHARING_MODE_MPS" (the default) or
        "SHARING_MODE_TIME_SLICING".
        """
        if isinstance(members, Mapping):
            members = list(members.items())
        request = pb.ReportColocationRequest(gpu=gpu, gpu_id=gpu_id, members=[_member(m) for m in members])
        if sharing_mode is not None:
            request.sharing_mode = pb.SharingMode.Value(sharing_mode)
        if observed_at is not None:
            request.observed_at.FromDatetime(observed_at.astimezone(_dt.timezone.utc))
        return self._call("ReportColocation", request)

    def assign(
        self, job_id: str, gpu_id: str, workload: str, *, node: str = "", gpu: str = "", lease_secs: int = 0
    ) -> pb.AssignJobResponse:
        """Records that a job runs on a GPU (AssignJob), for Place's occupancy."""
        return self._call(
            "AssignJob",
            pb.AssignJobRequest(job_id=job_id, gpu_id=gpu_id, workload=workload, node=node, gpu=gpu, lease_secs=lease_secs),
        )

    def release(self, job_id: str) -> pb.ReleaseJobResponse:
        """Forgets a job (ReleaseJob); released = False when it was not running."""
        return self._call("ReleaseJob", pb.ReleaseJobRequest(job_id=job_id))

    def gpus(self, *, nodes: Iterable[str] = (), gpu: str = "") -> list:
        """Every GPU of the occupancy with its running jobs (ListGpus, all pages)."""
        out, token = [], ""
        while True:
            page = self._call("ListGpus", pb.ListGpusRequest(page_size=1000, page_token=token, nodes=list(nodes), gpu=gpu))
            out += list(page.gpus)
            token = page.next_page_token
            if not token:
                return out

    def workloads(self, *, state: int = 0) -> list:
        """Every registered workload (ListWorkloads, all pages)."""
        out, token = [], ""
        while True:
            page = self._call("ListWorkloads", pb.ListWorkloadsRequest(page_size=1000, page_token=token, state=state))
            out += list(page.workloads)
            token = page.next_page_token
            if not token:
                return out

    def get_workload(self, name: str) -> pb.Workload:
        """One workload with its profiles (GetWorkload)."""
        return self._call("GetWorkload", pb.GetWorkloadRequest(name=name))

    def register(self, name: str, mode: Union[str, int], *, model: str = "", batch_size: int = 0,
                 labels: Optional[Mapping[str, str]] = None, profile: Optional[pb.Profile] = None) -> pb.Workload:
        """Registers a workload (RegisterWorkload); mode 'training' or 'inference'."""
        if isinstance(mode, str):
            mode = pb.WorkloadMode.Value(mode.upper())
        return self._call(
            "RegisterWorkload",
            pb.RegisterWorkloadRequest(name=name, mode=mode, model=model, batch_size=batch_size,
                                       labels=dict(labels or {}), profile=profile),
        )

    def train(self, *, gpu: str = "", kind: str = "") -> pb.TrainResponse:
        """Trains a challenger now and promotes it if it is not worse (Train)."""
        return self._call("Train", pb.TrainRequest(gpu=gpu, kind=kind))

    def model(self, *, gpu: str = "", version: int = 0) -> pb.Model:
        """The serving model of a GPU model, or a stored version (GetModel)."""
        return self._call("GetModel", pb.GetModelRequest(gpu=gpu, version=version))
