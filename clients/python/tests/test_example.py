"""examples/scheduler.py, run as a user would, against the real server."""

import json
import pathlib
import subprocess
import sys

from coloc_client import Advisor

from conftest import KACE, OPERATOR_TOKEN

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "scheduler.py"


def test_the_example_scheduler_places_assigns_releases_and_reports(server):
    with Advisor(server, token=OPERATOR_TOKEN) as advisor:
        before = advisor.model().rolling_error_samples
        done = subprocess.run(
            [sys.executable, EXAMPLE, "--addr", server, "--pairs", KACE / "pairs.csv", "--gpus", "3", "--jobs", "8",
             "--prefix", "ex"],
            env={"COLOC_TOKEN": OPERATOR_TOKEN, "PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=120,
        )
        assert done.returncode == 0, done.stderr
        summary = json.loads(done.stdout.strip().splitlines()[-1])
        assert summary["placed"] == 8 and summary["released"] == 8
        assert summary["reported"] >= 1
        # Every job of the example is released, on GPUs coloc learned from its assignments.
        gpus = advisor.gpus(nodes=["example-node"])
        assert {g.id for g in gpus} <= {"ex-gpu-0", "ex-gpu-1", "ex-gpu-2"} and len(gpus) == 3
        assert all(not g.jobs for g in gpus)
        # The reported runs reached the serving model's rolling error.
        assert advisor.model().rolling_error_samples >= before + summary["reported"]
