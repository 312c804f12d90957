#!/usr/bin/env python3
"""An example scheduler loop on coloc: jobs arrive, each is placed with Place on the GPU that
gains the most (and waits while no GPU gains), assigned there (AssignJob), released when it finishes (ReleaseJob), and every
colocated run it measured is reported back (ReportColocation) as training data.

Time is simulated (one tick per arrival). A real scheduler measures each job's throughput from
its own logs; this example has no GPU, so it "measures" a pair with the KACE recording of that
pair (--pairs, pairs.csv of the KACE V100 data) and reports nothing for a set it has no
recording of.

    python examples/scheduler.py --addr 127.0.0.1:50051 --pairs ../../../shared/data/kace-v100/pairs.csv \
        [--token TOKEN] [--gpus 3] [--jobs 8]
"""

import argparse
import csv
import json
import os
import sys
from collections import deque

from coloc_client import Advisor, AdvisorError


def recorded_pairs(path):
    """{(workload1, workload2): (throughput1, throughput2)} from a KACE pairs.csv."""
    pairs = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            pairs[(row["workload1"], row["workload2"])] = (float(row["w1throughput"]), float(row["w2throughput"]))
    return pairs


def run(advisor, jobs, gpu_ids, pairs, node="example-node", arrivals_per_tick=2, duration=4, log=lambda line: print(line, file=sys.stderr)):
    """Schedules jobs = [(job_id, workload)], `arrivals_per_tick` arriving each tick, each running
    `duration` ticks, at most 2 jobs per GPU (the recordings are of pairs). Returns a summary."""
    running = {g: [] for g in gpu_ids}  # gpu id -> [(job_id, workload, ends_at)]
    queue, pending = deque(jobs), deque()
    summary = {"placed": 0, "released": 0, "reported": 0, "waits": 0}
    tick = 0
    while queue or pending or any(running.values()):
        # Jobs that end now: report the run they shared (if measured), then release them.
        for gpu_id, members in running.items():
            done = [m for m in members if m[2] <= tick]
            if not done:
                continue
            if len(members) == 2:
                (j1, w1, _), (j2, w2, _) = members
                measured = pairs.get((w1, w2)) or (pairs.get((w2, w1)) or (None, None))[::-1]
                if measured[0] is not None:
                    answer = advisor.report([(w1, measured[0], j1), (w2, measured[1], j2)], gpu_id=gpu_id)
                    summary["reported"] += answer.created
                    log(f"t={tick} report {w1} + {w2} on {gpu_id}: observation {answer.observation_id}")
            for job_id, workload, _ in done:
                summary["released"] += advisor.release(job_id).released
                log(f"t={tick} release {job_id} ({workload}) from {gpu_id}")
            running[gpu_id] = [m for m in members if m[2] > tick]
        for _ in range(min(arrivals_per_tick, len(queue))):
            pending.append(queue.popleft())
        # Place what waits, oldest first.
        while pending:
            job_id, workload = pending[0]
            gpus = [{"id": g, "node": node, "residents": [m[1] for m in ms]} for g, ms in running.items()]
            answer = advisor.place(
                workload,
                gpus,
                objective="normalized_sum",
                max_jobs_per_gpu=2,
                min_job_fraction=0.3,
                min_resident_fraction=0.3,
            )
            # The gain is the GPU's predicted normalized sum with the job minus without it: at or
            # below 0 the job would take more from the residents than it adds, and waiting for a
            # free GPU does more work.
            best = answer.placements[0] if answer.placements else None
            if best is None or best.gain <= 0:
                summary["waits"] += 1
                why = [f"{s.gpu_id}: {s.reason}" for s in answer.skipped]
                if best is not None:
                    why.append(f"the best GPU, {best.gpu_id}, would gain {best.gain:.3f}")
                log(f"t={tick} {job_id} ({workload}) waits: " + "; ".join(why))
                break
            advisor.assign(job_id, best.gpu_id, workload, node=node, lease_secs=3600)
            running[best.gpu_id].append((job_id, workload, tick + duration))
            summary["placed"] += 1
            pending.popleft()
            log(f"t={tick} place {job_id} ({workload}) on {best.gpu_id}: gain {best.gain:.3f}")
        tick += 1
    return summary


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--addr", required=True, help="host:port of coloc serve")
    parser.add_argument("--token", default=os.environ.get("COLOC_TOKEN"), help="operator token (default $COLOC_TOKEN)")
    parser.add_argument("--ca-cert", help="CA certificate (PEM) of the server's TLS certificate")
    parser.add_argument("--pairs", required=True, help="KACE pairs.csv: the recorded runs used as measurements")
    parser.add_argument("--gpus", type=int, default=3, help="GPUs in the cluster")
    parser.add_argument("--jobs", type=int, default=8, help="jobs that arrive")
    parser.add_argument("--prefix", default="example", help="prefix of job and GPU ids")
    args = parser.parse_args()

    pairs = recorded_pairs(args.pairs)
    workloads = sorted({w for pair in pairs for w in pair})
    jobs = [(f"{args.prefix}-job-{i}", workloads[(i * 5) % len(workloads)]) for i in range(args.jobs)]
    gpu_ids = [f"{args.prefix}-gpu-{i}" for i in range(args.gpus)]
    print(f"{len(jobs)} jobs, {args.jobs // 2 + args.jobs % 2} ticks of arrivals, {len(gpu_ids)} GPUs", file=sys.stderr)
    with Advisor(args.addr, token=args.token, ca_cert=args.ca_cert) as advisor:
        try:
            summary = run(advisor, jobs, gpu_ids, pairs)
        except AdvisorError as error:
            sys.exit(f"coloc answered {error.code.name}: {error.details}")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
