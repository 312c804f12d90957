"""Matrix multiplication loop: a coloc example workload with one kernel per step.

Each step multiplies a batch of --batch-size random square matrices (--size x --size) by
another; timing, the start line and the NVTX range are `coloc_workload.py`'s. Prints one
line on stdout at the end:

    COLOC_THROUGHPUT <steps per second> iterations/s
"""

import argparse

import torch

import coloc_workload


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    coloc_workload.add_arguments(parser, batch_size=8)
    parser.add_argument("--size", type=int, default=2048, help="rows (and columns) of each matrix")
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.device(args.device)
    a = torch.randn(args.batch_size, args.size, args.size, device=device)
    b = torch.randn(args.batch_size, args.size, args.size, device=device)
    out = torch.empty_like(a)

    coloc_workload.measure(
        args,
        lambda: torch.bmm(a, b, out=out),
        *coloc_workload.torch_device_hooks(torch, device),
        work_per_step=1,
        unit="iterations/s",
    )


if __name__ == "__main__":
    main()
