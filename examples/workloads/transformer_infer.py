"""Transformer encoder inference on random tokens: a coloc example workload.

A BERT-base-sized torch.nn.TransformerEncoder (token embedding, 12 layers, d_model 768,
12 heads) runs forward passes under torch.inference_mode() on random token ids; no
downloads. Runs --warmup untimed steps, then --steps timed steps; the first timed step is
wrapped in the NVTX range `coloc_step` (on CUDA only) so that
`ncu --nvtx --nvtx-include coloc_step/` profiles exactly one inference step. Prints one line
on stdout at the end:

    COLOC_THROUGHPUT <sequences per second> samples/s
"""

import argparse
import sys
import time

import torch
from torch import nn


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps after warmup")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=30522)
    return parser.parse_args()


class Encoder(nn.Module):
    def __init__(self, vocab, d_model, heads, layers):
        super().__init__()
        self.embedding = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers)

    def forward(self, tokens):
        return self.encoder(self.embedding(tokens))


def main():
    args = parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    model = Encoder(args.vocab, args.d_model, args.heads, args.layers).to(device).eval()
    tokens = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device)

    def synchronize():
        if on_cuda:
            torch.cuda.synchronize()

    with torch.inference_mode():
        for _ in range(args.warmup):
            model(tokens)
        synchronize()

        start = time.perf_counter()
        for step in range(args.steps):
            if step == 0 and on_cuda:
                torch.cuda.nvtx.range_push("coloc_step")
            model(tokens)
            if step == 0 and on_cuda:
                synchronize()
                torch.cuda.nvtx.range_pop()
        synchronize()
        elapsed = time.perf_counter() - start

    print(f"{args.steps} steps in {elapsed:.3f} s", file=sys.stderr)
    print(f"COLOC_THROUGHPUT {args.steps * args.batch_size / elapsed:.1f} samples/s")


if __name__ == "__main__":
    main()
