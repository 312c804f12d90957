"""A torchvision model (ResNet-50 or ViT-B/16) on random data: a coloc example workload.

Random weights (no download), random images and labels. One step is a training step
(forward, backward, SGD update) with `--mode train`, or one forward pass under
torch.inference_mode() with `--mode inf`. Timing, the start line and the NVTX range are
`coloc_workload.py`'s. Prints one line on stdout at the end:

    COLOC_THROUGHPUT <images per second> samples/s

Needs torchvision beside torch.
"""

import argparse

import torch
import torchvision
from torch import nn

import coloc_workload

MODELS = {"resnet50": torchvision.models.resnet50, "vit_b_16": torchvision.models.vit_b_16}


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="resnet50")
    parser.add_argument("--mode", choices=["train", "inf"], default="train")
    coloc_workload.add_arguments(parser, batch_size=32)
    return parser.parse_args()


def main():
    args = parse_args()
    device = torch.device(args.device)
    model = MODELS[args.model](weights=None).to(device)
    images = torch.randn(args.batch_size, 3, 224, 224, device=device)
    hooks = coloc_workload.torch_device_hooks(torch, device)

    if args.mode == "train":
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        labels = torch.randint(0, 1000, (args.batch_size,), device=device)

        def train_step():
            optimizer.zero_grad(set_to_none=True)
            loss_fn(model(images), labels).backward()
            optimizer.step()

        coloc_workload.measure(
            args, train_step, *hooks, work_per_step=args.batch_size, unit="samples/s"
        )
    else:
        model.eval()
        with torch.inference_mode():
            coloc_workload.measure(
                args, lambda: model(images), *hooks, work_per_step=args.batch_size, unit="samples/s"
            )


if __name__ == "__main__":
    main()
