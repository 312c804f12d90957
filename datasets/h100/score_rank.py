#!/usr/bin/env python3
"""Rank's picks on this dataset, judged on its measured pairs.

For every workload as target, the candidates are all six workloads (a second copy of the
target included, as in KACE), and the score of a pick is its measured value over the best
candidate's, the measured values being the means of the repeated calibration runs:

- throughput sum: target + partner throughput (KACE's objective; units differ by workload);
- normalized sum: each member's throughput over its exclusive throughput (coloc's default).

Two protocols, through the real binary (`coloc import kace` into a fresh database, `coloc
serve`, `coloc rank`):

- all runs: the model is trained on every run, the target's own included (what a deployment
  that calibrated every pair answers);
- target unseen: the model is trained on the runs without the target (its profile only),
  as for a newly profiled workload before any of its pairs ran.

Usage: python3 datasets/h100/score_rank.py [--coloc target/release/coloc] [--json]
"""

import argparse
import csv
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from statistics import mean

HERE = os.path.dirname(os.path.abspath(__file__))
GPU = "NVIDIA H100 80GB HBM3"
GPU_MEMORY_GB = "79.6474609375"
OBJECTIVES = ["throughput", "normalized"]


def read_dataset(folder):
    with open(os.path.join(folder, "system_metrics.csv")) as f:
        exclusive = {row["Type"]: float(row["Exclusive100"]) for row in csv.DictReader(f)}
    runs = defaultdict(list)
    with open(os.path.join(folder, "pairs.csv")) as f:
        for row in csv.DictReader(f):
            runs[(row["workload1"], row["workload2"])].append(
                (float(row["w1throughput"]), float(row["w2throughput"]))
            )
    return exclusive, runs


def measured(exclusive, runs, target, partner, objective):
    """Mean over the runs of the pair {target, partner} of its objective value."""
    key = (target, partner) if (target, partner) in runs else (partner, target)
    values = []
    for t1, t2 in runs[key]:
        if objective == "throughput":
            values.append(t1 + t2)
        else:
            values.append(t1 / exclusive[key[0]] + t2 / exclusive[key[1]])
    return mean(values)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def picks(coloc, folder, targets):
    """Rank's first pick for each target and objective, from a server on a fresh database
    holding the KACE-format dataset in `folder`."""
    with tempfile.TemporaryDirectory() as work:
        env = dict(os.environ)
        env["COLOC__DATABASE__URL"] = f"sqlite://{work}/coloc.db"
        port = free_port()
        env["COLOC__SERVER__LISTEN"] = f"127.0.0.1:{port}"
        # No metrics endpoint: a server already on this host holds the default port.
        env["COLOC__METRICS__LISTEN"] = ""
        env["COLOC_ADDR"] = f"http://127.0.0.1:{port}"
        subprocess.run(
            [coloc, "import", "kace", folder, "--gpu", GPU, "--gpu-memory-gb", GPU_MEMORY_GB],
            env=env, check=True, capture_output=True,
        )
        log = open(os.path.join(work, "serve.log"), "w+")
        server = subprocess.Popen([coloc, "serve"], env=env, stdout=subprocess.DEVNULL, stderr=log)
        try:
            for _ in range(100):
                if subprocess.run([coloc, "health"], env=env, capture_output=True).returncode == 0:
                    break
                if server.poll() is not None:
                    log.seek(0)
                    sys.exit(f"coloc serve exited with {server.returncode}:\n{log.read()}")
                time.sleep(0.1)
            else:
                log.seek(0)
                sys.exit(f"coloc serve did not answer health checks in 10 s:\n{log.read()}")
            answer = {}
            for target in targets:
                for objective in OBJECTIVES:
                    out = subprocess.run(
                        [coloc, "rank", target, "--json", "--objective", objective,
                         "--include-below-break-even", "--top", "10"],
                        env=env, check=True, capture_output=True, text=True,
                    ).stdout
                    answer[(target, objective)] = json.loads(out)["ranked"][0]["workload"]
            return answer
        finally:
            server.terminate()
            server.wait()
            log.close()


def without(folder, target, work):
    """A copy of the dataset in `work` without the runs that hold `target`."""
    os.makedirs(work)
    for name in ["kernel_metrics.csv", "system_metrics.csv"]:
        with open(os.path.join(folder, name)) as src, open(os.path.join(work, name), "w") as dst:
            dst.write(src.read())
    with open(os.path.join(folder, "pairs.csv")) as src, open(os.path.join(work, "pairs.csv"), "w", newline="") as dst:
        reader = csv.DictReader(src)
        writer = csv.DictWriter(dst, fieldnames=reader.fieldnames)
        writer.writeheader()
        for row in reader:
            if target not in (row["workload1"], row["workload2"]):
                writer.writerow(row)
    return work


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coloc", default="target/release/coloc")
    parser.add_argument("--dataset", default=HERE)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    coloc = os.path.abspath(args.coloc)
    exclusive, runs = read_dataset(args.dataset)
    targets = sorted(exclusive)

    results = {"all runs": picks(coloc, args.dataset, targets), "target unseen": {}}
    with tempfile.TemporaryDirectory() as work:
        for target in targets:
            held_out = without(args.dataset, target, os.path.join(work, target))
            results["target unseen"].update(
                {k: v for k, v in picks(coloc, held_out, [target]).items()}
            )

    report = {}
    for objective in OBJECTIVES:
        rows = []
        for target in targets:
            values = {c: measured(exclusive, runs, target, c, objective) for c in targets}
            best = max(values.values())
            row = {"target": target, "best": max(values, key=values.get),
                   "random": mean(values.values()) / best}
            for protocol, answer in results.items():
                pick = answer[(target, objective)]
                row[protocol] = {"pick": pick, "score": values[pick] / best}
            rows.append(row)
        report[objective] = rows

    if args.json:
        json.dump(report, sys.stdout, indent=1)
        print()
        return
    for objective, rows in report.items():
        print(f"\n{objective} sum (score = measured value of the pick / best measured)")
        print(f"{'target':26} {'best partner':26} {'all runs':>30} {'target unseen':>30} {'random':>7}")
        for r in rows:
            cells = [f"{r[p]['pick'][:22]:>22} {r[p]['score']:.3f}" for p in results]
            print(f"{r['target']:26} {r['best']:26} {cells[0]:>30} {cells[1]:>30} {r['random']:7.3f}")
        means = [mean(r[p]["score"] for r in rows) for p in results]
        print(f"{'mean':53} {means[0]:30.3f} {means[1]:30.3f} {mean(r['random'] for r in rows):7.3f}")


if __name__ == "__main__":
    main()
