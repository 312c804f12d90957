"""Matrix multiplication loop: a coloc example workload with one kernel per step.

Each step multiplies a batch of --batch-size random square matrices (--size x --size) by
another. Runs --warmup untimed steps, then --steps timed steps; the first timed step is
wrapped in the NVTX range `coloc_step` (on CUDA only) so that
`ncu --nvtx --nvtx-include coloc_step/` profiles exactly one step. Prints one line on stdout
at the end:

    COLOC_THROUGHPUT <steps per second> iterations/s
"""

import argparse
import sys
import time

import torch


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps after warmup")
    parser.add_argument("--batch-size", type=int, default=8, help="matrices per step")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")
    parser.add_argument("--size", type=int, default=2048, help="rows (and columns) of each matrix")
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    a = torch.randn(args.batch_size, args.size, args.size, device=device)
    b = torch.randn(args.batch_size, args.size, args.size, device=device)
    out = torch.empty_like(a)

    def synchronize():
        if on_cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        torch.bmm(a, b, out=out)
    synchronize()

    start = time.perf_counter()
    for step in range(args.steps):
        if step == 0 and on_cuda:
            torch.cuda.nvtx.range_push("coloc_step")
        torch.bmm(a, b, out=out)
        if step == 0 and on_cuda:
            synchronize()
            torch.cuda.nvtx.range_pop()
    synchronize()
    elapsed = time.perf_counter() - start

    print(f"{args.steps} steps in {elapsed:.3f} s", file=sys.stderr)
    print(f"COLOC_THROUGHPUT {args.steps / elapsed:.1f} iterations/s")


if __name__ == "__main__":
    main()
