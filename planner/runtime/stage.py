"""A stage module: the plan's layer range, recomputation and (optionally) emulated compute.

The layers are the workload's own modules (``Workload.layers[start:stop]``), registered as
``layers.<k>`` so a stage's ``state_dict`` is the layers' state in order. Layer ``i`` takes
the output of layer ``i - 1`` as one argument (a tensor or a tuple of tensors, as the zoo
does); the stage's inputs arrive from ``torch.distributed.pipelining`` as ``*args``.

Recomputed layers run under non-reentrant ``torch.utils.checkpoint`` (the plan's
``stages[i].recompute``). Saved bytes are metered while the stage's forward runs.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.runtime.emulate import run_emulated
from planner.runtime.memory import SavedBytesMeter


class StageModule(nn.Module):
    def __init__(
        self,
        layers: Sequence[nn.Module],
        recompute: Sequence[bool],
        emulated_ms: Sequence[tuple[float, float]] | None = None,
    ) -> None:
        super().__init__()
        if len(recompute) != len(layers):
            raise ValueError("one recompute flag per layer")
        self.layers = nn.ModuleList(layers)
        self.recompute = tuple(recompute)
        self.emulated_ms = tuple(emulated_ms) if emulated_ms is not None else None
        self.meter = SavedBytesMeter([p for p in self.parameters()])

    def _run_layer(self, idx: int, x: Any) -> Any:
        if self.emulated_ms is None:
            return self.layers[idx](x)
        fwd_ms, bwd_ms = self.emulated_ms[idx]
        # a recomputed layer's forward re-runs inside its backward window (non-reentrant
        # checkpoint recomputes when backward first unpacks a saved tensor), so the window
        # is the recompute plus the backward
        window_ms = bwd_ms + fwd_ms if self.recompute[idx] else bwd_ms
        return run_emulated(self.layers[idx], x, fwd_ms, window_ms)

    def forward(self, *args: Any) -> Any:
        x: Any = args[0] if len(args) == 1 else tuple(args)
        with self.meter.hooks():
            for idx in range(len(self.layers)):
                if self.recompute[idx] and torch.is_grad_enabled():
                    x = checkpoint(self._run_layer, idx, x, use_reentrant=False)
                else:
                    x = self._run_layer(idx, x)
        return x
