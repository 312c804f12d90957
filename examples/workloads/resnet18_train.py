"""ResNet-18 training step on random data: a coloc example workload.

Runs --warmup untimed steps, then --steps timed steps (forward, backward, SGD update) on
random images and labels; no downloads. The first timed step is wrapped in the NVTX range
`coloc_step` (on CUDA only) so that `ncu --nvtx --nvtx-include coloc_step/` profiles exactly
one training step. Prints one line on stdout at the end:

    COLOC_THROUGHPUT <samples per second> samples/s

ResNet-18 is defined here with torch.nn only, so torchvision is not needed.
"""

import argparse
import sys
import time

import torch
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, in_channels, out_channels, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Identity()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x):
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def resnet18(num_classes=1000):
    layers = [
        nn.Conv2d(3, 64, 7, 2, 3, bias=False),
        nn.BatchNorm2d(64),
        nn.ReLU(inplace=True),
        nn.MaxPool2d(3, 2, 1),
    ]
    in_channels = 64
    for out_channels, stride in [(64, 1), (128, 2), (256, 2), (512, 2)]:
        layers += [BasicBlock(in_channels, out_channels, stride), BasicBlock(out_channels, out_channels, 1)]
        in_channels = out_channels
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes)]
    return nn.Sequential(*layers)


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=100, help="timed steps after warmup")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--warmup", type=int, default=10, help="untimed steps before the timed ones")
    parser.add_argument("--image-size", type=int, default=224)
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    model = resnet18().to(device).train()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    images = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device)
    labels = torch.randint(0, 1000, (args.batch_size,), device=device)

    def train_step():
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(images), labels)
        loss.backward()
        optimizer.step()

    def synchronize():
        if on_cuda:
            torch.cuda.synchronize()

    for _ in range(args.warmup):
        train_step()
    synchronize()

    start = time.perf_counter()
    for step in range(args.steps):
        if step == 0 and on_cuda:
            torch.cuda.nvtx.range_push("coloc_step")
        train_step()
        if step == 0 and on_cuda:
            synchronize()
            torch.cuda.nvtx.range_pop()
    synchronize()
    elapsed = time.perf_counter() - start

    print(f"{args.steps} steps in {elapsed:.3f} s", file=sys.stderr)
    print(f"COLOC_THROUGHPUT {args.steps * args.batch_size / elapsed:.1f} samples/s")


if __name__ == "__main__":
    main()
