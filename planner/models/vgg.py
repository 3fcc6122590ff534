"""VGG-style CNN: a chain of 3x3 convolutions with ReLU, max-pooling every few convolutions
(width doubled after each pool), and an MLP classifier (Simonyan & Zisserman 2015).

Each convolution is one layer (``conv0`` .. ``conv{N-1}``), the classifier is ``head``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.common import generator, mean_cross_entropy, parse_dtype, seeded
from planner.models.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class VGGConfig:
    """Options of ``vgg:...``."""

    convs: int = 6
    """3x3 convolution layers"""
    width: int = 16
    """channels of the first convolutions"""
    pool_every: int = 2
    """max-pool (and double the width) after this many convolutions"""
    image: int = 32
    """image height and width"""
    classes: int = 10
    """output classes"""
    seed: int = 0
    """weight seed"""
    dtype: str = "float32"
    """parameter and input dtype: float32 | float64 | bfloat16"""


class Conv(nn.Module):
    def __init__(self, cin: int, cout: int, pool: bool) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, padding=1)
        self.pool = pool

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.relu(self.conv(x))
        return F.max_pool2d(y, 2) if self.pool else y


class Head(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.fc1 = nn.Linear(channels * 4, 4 * channels)
        self.fc2 = nn.Linear(4 * channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.adaptive_avg_pool2d(x, 2).flatten(1)
        return self.fc2(F.relu(self.fc1(x)))


def build(cfg: VGGConfig) -> Workload:
    """The VGG workload: normal images in, uniform labels as targets."""
    layers: list[nn.Module] = []
    size, cin, cout = cfg.image, 3, cfg.width
    with seeded(cfg.seed):
        for i in range(cfg.convs):
            pool = (i + 1) % cfg.pool_every == 0 and size >= 2
            layers.append(Conv(cin, cout, pool))
            cin = cout
            if pool:
                size //= 2
                cout *= 2
        layers.append(Head(cin, cfg.classes))
    dtype = parse_dtype(cfg.dtype)

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = generator(seed)
        images = torch.randn(batch_size, 3, cfg.image, cfg.image, generator=gen).to(dtype)
        return images, torch.randint(cfg.classes, (batch_size,), generator=gen)

    return Workload(
        name="vgg",
        layers=tuple(m.to(dtype) for m in layers),
        layer_names=(*(f"conv{i}" for i in range(cfg.convs)), "head"),
        make_batch=make_batch,
        loss_fn=mean_cross_entropy,
        options={k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
    )
