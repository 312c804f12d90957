#!/usr/bin/env python3
"""A comparison peer for coloc's load generator: what a user would build instead of coloc.

It serves only coloc.v1.ColocationAdvisor/Rank (every other method is UNIMPLEMENTED) and
grpc.health.v1.Health, ranking with the KACE paper's model: a plain scikit-learn
LinearRegression from the element-wise sum of the two workloads' ten profile metrics to their
colocated throughput sum, fitted once at start from two CSV files.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.resources
import signal
import sys
import tempfile
import threading
from concurrent import futures
from types import ModuleType
from typing import Any

import grpc
import pandas as pd
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_tools import protoc
from sklearn.linear_model import LinearRegression

SERVICE = "coloc.v1.ColocationAdvisor"
# The six Nsight Compute kernel metrics, then the four NVML system metrics (KACE).
FEATURES = [
    "threads",
    "compute_throughput_pct",
    "dram_throughput_pct",
    "memory_throughput_pct",
    "registers",
    "static_shared_memory_bytes",
    "exclusive_throughput",
    "sm_busy_pct",
    "mem_busy_pct",
    "memory_gb",
]
GRACE_SECS = 2.0


def load_stubs(proto_dir: str) -> tuple[ModuleType, ModuleType]:
    """Generates the Python code of coloc/v1/advisor.proto into a temporary directory and imports it."""
    well_known = str(importlib.resources.files("grpc_tools") / "_proto")
    with tempfile.TemporaryDirectory(prefix="coloc-peer-") as out:
        status = protoc.main(
            [
                "grpc_tools.protoc",
                f"-I{proto_dir}",
                f"-I{well_known}",
                f"--python_out={out}",
                f"--grpc_python_out={out}",
                "coloc/v1/advisor.proto",
            ]
        )
        if status != 0:
            sys.exit(f"protoc failed on {proto_dir}/coloc/v1/advisor.proto (exit {status})")
        sys.path.insert(0, out)
        try:
            pb = importlib.import_module("coloc.v1.advisor_pb2")
            pb_grpc = importlib.import_module("coloc.v1.advisor_pb2_grpc")
        finally:
            sys.path.remove(out)
    return pb, pb_grpc


def read_csv(path: str, columns: list[str], names: list[str]) -> pd.DataFrame:
    """Reads a CSV that must have `columns`; the `names` columns are read as strings."""
    table = pd.read_csv(path, dtype={name: str for name in names})
    missing = set(columns) - set(table.columns)
    if missing:
        sys.exit(f"{path}: missing columns {sorted(missing)}")
    return table


def load_profiles(path: str) -> pd.DataFrame:
    """One row of the ten metrics per workload, indexed by name."""
    table = read_csv(path, ["workload", *FEATURES], ["workload"])
    twice = table["workload"][table["workload"].duplicated()]
    if not twice.empty:
        sys.exit(f"{path}: workload {twice.iloc[0]!r} is listed twice")
    return table.set_index("workload")[FEATURES].astype(float)


def fit(profiles: pd.DataFrame, path: str) -> LinearRegression:
    """KACE: throughput_sum ~ profile(a) + profile(b), ordinary least squares (see requirements.txt)."""
    runs = read_csv(path, ["workload_a", "workload_b", "throughput_sum"], ["workload_a", "workload_b"])
    if runs.empty:
        sys.exit(f"{path}: no observations")
    unknown = (set(runs["workload_a"]) | set(runs["workload_b"])) - set(profiles.index)
    if unknown:
        sys.exit(f"{path}: workloads without a profile: {sorted(unknown)}")
    first = profiles.loc[runs["workload_a"]].reset_index(drop=True)
    second = profiles.loc[runs["workload_b"]].reset_index(drop=True)
    pairs = first + second
    model = LinearRegression().fit(pairs, runs["throughput_sum"])
    r2 = model.score(pairs, runs["throughput_sum"])
    print(f"fitted on {len(runs)} observations, in-sample R2 {r2:.3f}", file=sys.stderr)
    return model


class Advisor:
    """Rank only; combined with the generated servicer (UNIMPLEMENTED for the rest) in serve()."""

    def __init__(
        self, pb: ModuleType, profiles: pd.DataFrame, model: LinearRegression, gpu_memory_gb: float
    ) -> None:
        self.pb = pb
        self.profiles = profiles
        self.model = model
        self.gpu_memory_gb = gpu_memory_gb

    def Rank(self, request: Any, context: grpc.ServicerContext) -> Any:
        pb, profiles = self.pb, self.profiles
        if request.target not in profiles.index:
            context.abort(grpc.StatusCode.NOT_FOUND, f"target {request.target!r} is not a known workload")
        if request.top_k < 0 or request.gpu_memory_gb < 0:
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "top_k and gpu_memory_gb must not be negative")
        if request.objective != pb.THROUGHPUT_SUM or request.max_target_slowdown != 0:
            context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the KACE model predicts only the set's sum; NORMALIZED_SUM and "
                "max_target_slowdown need per-member predictions",
            )
        names = list(request.candidates)
        if len(set(names)) != len(names):
            context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a candidate is listed twice")
        limit = request.gpu_memory_gb or self.gpu_memory_gb

        skipped = [
            pb.SkippedCandidate(
                workload=name, reason=f"{name} is not a known workload", code=pb.UNKNOWN_WORKLOAD
            )
            for name in names
            if name not in profiles.index
        ]
        known = [name for name in names if name in profiles.index] if names else profiles.index
        pairs = profiles.loc[known] + profiles.loc[request.target]
        fits = pairs["memory_gb"] <= limit
        if not request.include_oversubscribed:
            skipped += [
                pb.SkippedCandidate(
                    workload=name,
                    reason=f"with the target it needs {memory:.1f} GB, more than the {limit:.1f} GB available",
                    code=pb.EXCEEDS_GPU_MEMORY,
                )
                for name, memory in pairs.loc[~fits, "memory_gb"].items()
            ]
            pairs, fits = pairs[fits], fits[fits]

        ranked = []
        if not pairs.empty:
            predicted = self.model.predict(pairs)
            rows = sorted(
                zip(predicted.tolist(), pairs.index, pairs["memory_gb"].tolist(), fits.tolist()),
                key=lambda row: (-row[0], row[1]),
            )
            if request.top_k:
                rows = rows[: request.top_k]
            ranked = [
                pb.RankedCandidate(
                    workload=name, predicted_throughput_sum=sum_, fits_memory=fit_, memory_gb=memory
                )
                for sum_, name, memory, fit_ in rows
            ]
        return pb.RankResponse(
            ranked=ranked,
            skipped=skipped,
            model_version=1,
            gpu=request.gpu or "peer",
            gpu_memory_gb=limit,
        )


def serve(args: argparse.Namespace) -> None:
    pb, pb_grpc = load_stubs(args.proto_dir)
    profiles = load_profiles(args.profiles)
    advisor = type("PeerAdvisor", (Advisor, pb_grpc.ColocationAdvisorServicer), {})(
        pb, profiles, fit(profiles, args.observations), args.gpu_memory_gb
    )

    # No SO_REUSEPORT: a busy port is an error, not a second server sharing it.
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=args.workers), options=[("grpc.so_reuseport", 0)]
    )
    pb_grpc.add_ColocationAdvisorServicer_to_server(advisor, server)
    health_servicer = health.HealthServicer()
    for service in ("", SERVICE):
        health_servicer.set(service, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    try:
        port = server.add_insecure_port(f"{args.host}:{args.port}")
    except RuntimeError as err:
        sys.exit(f"cannot listen on {args.host}:{args.port}: {err}")
    stopping = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stopping.set())
    server.start()
    print(f"listening on {args.host}:{port}", flush=True)
    stopping.wait()
    health_servicer.enter_graceful_shutdown()
    server.stop(GRACE_SECS).wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proto-dir", required=True, help="the directory that holds coloc/v1/advisor.proto")
    parser.add_argument("--profiles", required=True, help="profiles CSV, one row per workload")
    parser.add_argument(
        "--observations", required=True, help="observations CSV: colocated pairs and their throughput sum"
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 = any free port")
    parser.add_argument("--workers", type=int, default=16, help="gRPC thread pool size")
    parser.add_argument(
        "--gpu-memory-gb", type=float, default=32.0, help="memory limit when a request sets none"
    )
    serve(parser.parse_args())


if __name__ == "__main__":
    main()
