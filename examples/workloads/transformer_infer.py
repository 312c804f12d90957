"""Transformer encoder inference on random tokens: a coloc example workload.

A BERT-base-sized torch.nn.TransformerEncoder (token embedding, 12 layers, d_model 768,
12 heads) runs forward passes under torch.inference_mode() on random token ids; no
downloads. One step is one forward pass; timing, the start line and the NVTX range are
`coloc_workload.py`'s. Prints one line on stdout at the end:

    COLOC_THROUGHPUT <sequences per second> samples/s
"""

import argparse

import torch
from torch import nn

import coloc_workload


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    coloc_workload.add_arguments(parser, batch_size=16)
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
    model = Encoder(args.vocab, args.d_model, args.heads, args.layers).to(device).eval()
    tokens = torch.randint(0, args.vocab, (args.batch_size, args.seq_len), device=device)

    with torch.inference_mode():
        coloc_workload.measure(
            args,
            lambda: model(tokens),
            *coloc_workload.torch_device_hooks(torch, device),
            work_per_step=args.batch_size,
            unit="samples/s",
        )


if __name__ == "__main__":
    main()
