"""ResNet-style CNN whose residual connections span layer boundaries.

After He et al. 2016 (basic blocks, 3x3 convolutions, projection shortcut when the shape
changes), with GroupNorm (Wu & He 2018) instead of BatchNorm so that samples stay
independent and a batch split into micro-batches trains exactly like the whole batch.

Each basic block is two layers, so a stage boundary may fall inside it and the skip tensor
crosses that boundary: ``block{k}.a`` returns ``(h, x)`` (its output and the block input,
passed through unchanged) and ``block{k}.b`` returns ``relu(norm(conv(h)) + shortcut(x))``.
Layers: ``stem``, ``block0.a``, ``block0.b``, ..., ``head``. The second half of the blocks
runs at half resolution and twice the width.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.common import generator, mean_cross_entropy, parse_dtype, seeded
from planner.models.workload import Workload


@dataclass(frozen=True, slots=True, kw_only=True)
class ResNetConfig:
    """Options of ``resnet:...``."""

    blocks: int = 4
    """basic blocks (two layers each)"""
    width: int = 16
    """channels of the first stage (doubled in the second half)"""
    image: int = 32
    """image height and width"""
    classes: int = 10
    """output classes"""
    seed: int = 0
    """weight seed"""
    dtype: str = "float32"
    """parameter and input dtype: float32 | float64 | bfloat16"""


def _norm(channels: int) -> nn.GroupNorm:
    return nn.GroupNorm(min(8, channels), channels)


class Stem(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.norm = _norm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.relu(self.norm(self.conv(x)))


class BlockA(nn.Module):
    """First half of a basic block: returns ``(h, x)``, carrying the skip tensor on."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.norm = _norm(cout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return F.relu(self.norm(self.conv(x))), x


class BlockB(nn.Module):
    """Second half: ``relu(norm(conv(h)) + shortcut(x))``, shortcut a 1x1 projection if needed."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.norm = _norm(cout)
        self.shortcut: nn.Module = nn.Identity()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), _norm(cout))

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h, x = hx
        return F.relu(self.norm(self.conv(h)) + self.shortcut(x))


class Head(nn.Module):
    def __init__(self, channels: int, classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean(dim=(2, 3)))


def build(cfg: ResNetConfig) -> Workload:
    """The ResNet workload: ``make_batch`` draws normal images and uniform labels."""
    layers: list[nn.Module] = []
    names: list[str] = []
    with seeded(cfg.seed):
        layers.append(Stem(cfg.width))
        names.append("stem")
        cin = cfg.width
        for k in range(cfg.blocks):
            second_half = k >= (cfg.blocks + 1) // 2
            cout = cfg.width * (2 if second_half else 1)
            stride = 2 if cout != cin else 1
            layers += [BlockA(cin, cout, stride), BlockB(cin, cout, stride)]
            names += [f"block{k}.a", f"block{k}.b"]
            cin = cout
        layers.append(Head(cin, cfg.classes))
        names.append("head")
    dtype = parse_dtype(cfg.dtype)

    def make_batch(batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = generator(seed)
        images = torch.randn(batch_size, 3, cfg.image, cfg.image, generator=gen).to(dtype)
        labels = torch.randint(cfg.classes, (batch_size,), generator=gen)
        return images, labels

    return Workload(
        name="resnet",
        layers=tuple(m.to(dtype) for m in layers),
        layer_names=tuple(names),
        make_batch=make_batch,
        loss_fn=mean_cross_entropy,
        options={k: getattr(cfg, k) for k in cfg.__dataclass_fields__},
    )
