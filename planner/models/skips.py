"""Layer chains with skip connections carried for you: :func:`chain`.

A workload's layers are called one after the other, ``out = layers[i](out)``, and a tuple a
layer returns reaches the next layer as *one* argument. A model whose blocks also read the
output of an earlier block (a U-Net's encoder features, a DenseNet's concatenations) must
therefore carry each such tensor through every layer in between. :func:`chain` writes those
wrappers: give it the modules in order and the skips between them, and each returned layer
calls its module with the previous output and the skip tensors addressed to it, and passes
on what later layers still need.

A U-Net (Ronneberger et al. 2015) on 16x16 images, as a workload, in 15 lines::

    import torch
    from torch import nn
    from planner.models import chain
    from planner.models.workload import Workload

    def conv(i, o): return nn.Sequential(nn.Conv2d(i, o, 3, padding=1), nn.ReLU())
    class Up(nn.Module):  # upsample, join the skip along the channels, convolve
        def __init__(self, i, o): super().__init__(); self.conv = conv(i, o)
        def forward(self, x, skip): return self.conv(torch.cat([nn.functional.interpolate(x, scale_factor=2.0), skip], 1))
    modules = [conv(3, 8), nn.Sequential(nn.MaxPool2d(2), conv(8, 16)), nn.Sequential(nn.MaxPool2d(2), conv(16, 32)),
               Up(32 + 16, 16), Up(16 + 8, 8), nn.Conv2d(8, 4, 1)]
    layers = chain(modules, skips=[(1, 3), (0, 4)])  # encoder 1 -> decoder 3, encoder 0 -> decoder 4
    def make_batch(n, seed):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(n, 3, 16, 16, generator=g), torch.randint(4, (n, 16, 16), generator=g)
    unet = Workload(name="unet", layers=tuple(layers), layer_names=("enc0", "enc1", "mid", "dec1", "dec0", "out"),
                    make_batch=make_batch, loss_fn=nn.functional.cross_entropy)

Rules (:class:`ChainLayer`): a skip ``(src, dst)`` hands the output of module ``src`` to module
``dst`` (``src < dst``) as an extra argument; module ``dst`` is called as
``modules[dst](previous_output, *skip_outputs)`` with its skips in the order of their sources.
A layer returns its module's output alone when nothing is carried past it, else the flat tuple
``(output, *carried)`` with the carried tensors in the order of their sources, so each crosses
a stage boundary once (``planner profile`` records the bytes; the solver prices them). Module 0
receives the batch inputs as the workload gives them. Every module returns one tensor (a
module that returns a tuple cannot be told apart from the carried tensors).

Parameters keep their names under the layer's ``module`` attribute (``module.0.weight``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from torch import nn

from planner.artifacts.errors import PlannerInputError

__all__ = ["ChainLayer", "chain"]


class ChainLayer(nn.Module):
    """Module ``index`` of a chain: reads its input and the skips addressed to it from the
    incoming tuple, returns its output with the tensors later layers still need."""

    def __init__(self, module: nn.Module, index: int, incoming: tuple[int, ...], takes: tuple[int, ...],
                 outgoing: tuple[int, ...]) -> None:
        super().__init__()
        self.module = module
        self.index = index
        self.incoming = incoming  # sources carried into this layer, in order (after the previous output)
        self.takes = takes  # sources whose outputs this module reads, in order
        self.outgoing = outgoing  # sources carried out of this layer, in order

    def forward(self, x: Any) -> Any:
        if self.incoming:
            previous, *carried = x
            values = dict(zip(self.incoming, carried))
        else:
            previous, values = x, {}
        y = self.module(previous, *(values[s] for s in self.takes))
        values[self.index] = y
        if not self.outgoing:
            return y
        return (y, *(values[s] for s in self.outgoing))

    def extra_repr(self) -> str:
        return f"index={self.index}, skips_in={list(self.takes)}, carried_out={list(self.outgoing)}"


def chain(modules: Sequence[nn.Module], skips: Iterable[tuple[int, int]] = ()) -> list[ChainLayer]:
    """The modules as workload layers with the ``skips`` (pairs ``(src, dst)``) carried
    between them (see the module docstring). Raises :class:`PlannerInputError` on a skip that
    does not go forward between two of the modules, or that is given twice."""
    n = len(modules)
    pairs = [tuple(pair) for pair in skips]
    for pair in pairs:
        if len(pair) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in pair):
            raise PlannerInputError(f"chain: a skip is a pair (src, dst) of module indices (got {pair!r})")
        src, dst = pair
        if not 0 <= src < dst < n:
            raise PlannerInputError(f"chain: skip ({src}, {dst}) must go forward between two of the {n} modules (0 <= src < dst)")
    if len(set(pairs)) != len(pairs):
        dup = next(p for p in pairs if pairs.count(p) > 1)
        raise PlannerInputError(f"chain: skip {dup} is given twice")

    def live_after(i: int) -> tuple[int, ...]:
        return tuple(sorted({s for s, d in pairs if s <= i < d}))

    layers = []
    for i, module in enumerate(modules):
        takes = tuple(sorted(s for s, d in pairs if d == i))
        layers.append(ChainLayer(module, i, live_after(i - 1) if i else (), takes, live_after(i)))
    return layers
