"""A training loop that tells coloc's observer its throughput: every --every steps it pushes
the samples per second since the last push to `POST /observer/throughput` on the coloc
server's metrics endpoint (docs/observer.md), with the pod's UID from the POD_UID
environment variable (in Kubernetes, the Downward API's metadata.uid). The loop itself is
`matmul_loop.py`'s batched matrix multiplication; any loop does the same with two lines.

    POD_UID=$(uuidgen) python3 examples/workloads/push_throughput.py --coloc 127.0.0.1:50052
"""

import argparse
import time

import torch

from coloc_client import ThroughputPusher


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--coloc", required=True, help="host:port of coloc's metrics endpoint")
    parser.add_argument("--every", type=int, default=50, help="steps between two pushes")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to run")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--size", type=int, default=2048)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    a = torch.randn(args.batch_size, args.size, args.size, device=device)
    b = torch.randn(args.batch_size, args.size, args.size, device=device)
    out = torch.empty_like(a)
    pusher = ThroughputPusher(args.coloc, every=args.every,
                              on_error=lambda e: print(f"push failed: {e}", flush=True))
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        torch.bmm(a, b, out=out)
        if device.type == "cuda":
            torch.cuda.synchronize()
        pushed = pusher.step(args.batch_size)
        if pushed is not None:
            print(f"pushed {pushed:.2f} samples/s", flush=True)


if __name__ == "__main__":
    main()
