"""ResNet-18 training step on random data: a coloc example workload.

One step is a forward pass, a backward pass and an SGD update on random images and labels;
no downloads. Timing, the start line and the NVTX range are `coloc_workload.py`'s. Prints
one line on stdout at the end:

    COLOC_THROUGHPUT <samples per second> samples/s

ResNet-18 is defined here with torch.nn only, so torchvision is not needed.
"""

import argparse

import torch
from torch import nn

import coloc_workload


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
    coloc_workload.add_arguments(parser, batch_size=32)
    parser.add_argument("--image-size", type=int, default=224)
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.device(args.device)
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

    coloc_workload.measure(
        args,
        train_step,
        *coloc_workload.torch_device_hooks(torch, device),
        work_per_step=args.batch_size,
        unit="samples/s",
    )


if __name__ == "__main__":
    main()
