"""A GPT-style decoder generating tokens: a coloc example workload.

A GPT-2-small-sized decoder (12 layers, d_model 768, 12 heads, vocabulary 50,257) with
random weights. One step reads a random prompt of --prompt-len tokens for each of
--batch-size sequences (prefill), then generates --new-tokens tokens one at a time,
greedily, with a key/value cache: the memory-bound decoding loop of LLM serving. Timing,
the start line and the NVTX range are `coloc_workload.py`'s. Prints one line on stdout at
the end:

    COLOC_THROUGHPUT <generated tokens per second> tokens/s
"""

import argparse

import torch
from torch import nn
from torch.nn import functional as F

import coloc_workload


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    coloc_workload.add_arguments(parser, batch_size=4)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=16)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--d-model", type=int, default=768)
    parser.add_argument("--heads", type=int, default=12)
    parser.add_argument("--vocab", type=int, default=50257)
    return parser.parse_args()


class Block(nn.Module):
    def __init__(self, d_model, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.proj = nn.Linear(d_model, d_model)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )

    def forward(self, x, cache):
        """x: (batch, new, d_model); cache: (keys, values) so far, or None."""
        batch, new, d_model = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d_model, dim=2)
        shape = (batch, new, self.heads, d_model // self.heads)
        q, k, v = (t.view(shape).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k = torch.cat([cache[0], k], dim=2)
            v = torch.cat([cache[1], v], dim=2)
        attended = F.scaled_dot_product_attention(q, k, v, is_causal=cache is None)
        x = x + self.proj(attended.transpose(1, 2).reshape(batch, new, d_model))
        return x + self.mlp(self.ln2(x)), (k, v)


class Decoder(nn.Module):
    def __init__(self, vocab, d_model, heads, layers, max_len):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d_model)
        self.positions = nn.Embedding(max_len, d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    def forward(self, tokens, start, caches):
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        x = self.tokens(tokens) + self.positions(positions)
        caches = caches or [None] * len(self.blocks)
        new_caches = []
        for block, cache in zip(self.blocks, caches):
            x, cache = block(x, cache)
            new_caches.append(cache)
        return self.head(self.ln(x[:, -1])), new_caches


def main():
    args = parse_args()
    device = torch.device(args.device)
    max_len = args.prompt_len + args.new_tokens
    model = Decoder(args.vocab, args.d_model, args.heads, args.layers, max_len).to(device).eval()
    prompt = torch.randint(0, args.vocab, (args.batch_size, args.prompt_len), device=device)

    def generate():
        logits, caches = model(prompt, 0, None)
        for i in range(args.new_tokens):
            token = logits.argmax(dim=-1, keepdim=True)
            logits, caches = model(token, args.prompt_len + i, caches)

    with torch.inference_mode():
        coloc_workload.measure(
            args,
            generate,
            *coloc_workload.torch_device_hooks(torch, device),
            work_per_step=args.batch_size * args.new_tokens,
            unit="tokens/s",
        )


if __name__ == "__main__":
    main()
