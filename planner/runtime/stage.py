"""A stage module: the plan's layer range and its recomputation.

The layers are the workload's own modules (``Workload.layers[start:stop]``), registered as
``layers.<k>`` so a stage's ``state_dict`` is the layers' state in order. Layer ``i`` takes
the output of layer ``i - 1`` as one argument (a tensor or a tuple of tensors, as the zoo
does); the stage's inputs arrive from ``torch.distributed.pipelining`` as ``*args``. The
stage's outputs are made contiguous (they are sent to the next stage).

Recomputed layers run under non-reentrant ``torch.utils.checkpoint`` (the plan's
``stages[i].recompute``). Saved bytes are metered while the stage's forward runs, when
``metering`` is on (the engine meters the first step of a run only: shapes do not change
between steps, and the Python hooks would otherwise cost host time in every timed step).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.runtime.memory import SavedBytesMeter


class StageModule(nn.Module):
    def __init__(
        self,
        layers: Sequence[nn.Module],
        recompute: Sequence[bool],
    ) -> None:
        super().__init__()
        if len(recompute) != len(layers):
            raise ValueError("one recompute flag per layer")
        self.layers = nn.ModuleList(layers)
        self.recompute = tuple(recompute)
        self.meter = SavedBytesMeter([p for p in self.parameters()])
        self.metering = True  # saved-tensor hooks on; the engine turns them off after the first step

    def _run_layer(self, idx: int, x: Any) -> Any:
        return self.layers[idx](x)

    def forward(self, *args: Any) -> Any:
        x: Any = args[0] if len(args) == 1 else tuple(args)
        with self.meter.hooks() if self.metering else contextlib.nullcontext():
            for idx in range(len(self.layers)):
                if self.recompute[idx] and torch.is_grad_enabled():
                    x = checkpoint(self._run_layer, idx, x, use_reentrant=False)
                else:
                    x = self._run_layer(idx, x)
        return _contiguous(x)


def _contiguous(value: Any) -> Any:
    """The stage's output with every tensor contiguous (a no-op for contiguous ones): what
    crosses a boundary is sent, and gloo sends only contiguous tensors (a layer may return a
    transposed view; the layer contract accepts it, ``planner.profiling.measured.contract``)."""
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, tuple):
        return tuple(_contiguous(v) for v in value)
    return value
