"""The timing contract the example workloads share (see README.md beside this file).

`add_arguments` adds the common flags; `measure` runs the warmup steps, waits at the start
line when coloc runs several workloads together, times the steps (a count, or a duration),
marks the first timed step with the NVTX range `coloc_step` for Nsight Compute, and prints
the one stdout line coloc reads:

    COLOC_THROUGHPUT <value> <unit>

Only the standard library is imported here; the scripts pass in what needs torch.
"""

import os
import sys
import time

NVTX_RANGE = "coloc_step"
# How long a member waits at the start line for the others before it times alone.
START_LINE_TIMEOUT_S = 600.0


def add_arguments(parser, batch_size):
    parser.add_argument("--steps", type=int, default=100, help="timed steps after warmup")
    parser.add_argument(
        "--seconds",
        type=float,
        default=0.0,
        help="time steps for this long instead of counting --steps (0 = count steps)",
    )
    parser.add_argument("--batch-size", type=int, default=batch_size)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")


def wait_at_start_line():
    """When coloc runs members together (`coloc calibrate`), it names a fresh folder in
    COLOC_START_DIR and the number of members in COLOC_START_COUNT: each member, warmed up,
    leaves a file there and starts timing once every member has, so that all of them time
    the same stretch together."""
    folder = os.environ.get("COLOC_START_DIR")
    if not folder:
        return
    count = int(os.environ.get("COLOC_START_COUNT", "1"))
    mark = os.path.join(folder, f"ready-{os.getpid()}")
    with open(mark + ".tmp", "w") as f:
        f.write("ready\n")
    os.rename(mark + ".tmp", mark)
    deadline = time.monotonic() + START_LINE_TIMEOUT_S
    while sum(1 for name in os.listdir(folder) if name.startswith("ready-")) < count:
        if time.monotonic() > deadline:
            print("the other members never reached the start line; timing alone", file=sys.stderr)
            return
        time.sleep(0.005)


def measure(args, step, synchronize, nvtx_push, nvtx_pop, work_per_step, unit):
    """Runs `step` as the flags say and prints the throughput: work_per_step x steps per
    second. `synchronize`, `nvtx_push(name)` and `nvtx_pop()` are the device's (no-ops on
    CPU)."""
    for _ in range(args.warmup):
        step()
    synchronize()
    wait_at_start_line()

    steps = 0
    start = time.perf_counter()
    while True:
        if steps == 0:
            nvtx_push(NVTX_RANGE)
        step()
        if steps == 0:
            synchronize()
            nvtx_pop()
        steps += 1
        if args.seconds > 0:
            # Synchronized each step, so that the window ends when the time is up rather
            # than when a queue of launched steps drains (seconds later for short kernels):
            # members run together for the same stretch.
            synchronize()
            if time.perf_counter() - start >= args.seconds:
                break
        elif steps >= args.steps:
            break
    synchronize()
    elapsed = time.perf_counter() - start

    print(f"{steps} steps in {elapsed:.3f} s", file=sys.stderr)
    print(f"COLOC_THROUGHPUT {steps * work_per_step / elapsed:.3f} {unit}", flush=True)


def torch_device_hooks(torch, device):
    """`synchronize`, `nvtx_push` and `nvtx_pop` for a torch device (no-ops off CUDA)."""
    if device.type != "cuda":
        return (lambda: None), (lambda name: None), (lambda: None)
    return torch.cuda.synchronize, torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
