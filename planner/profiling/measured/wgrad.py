"""What each layer keeps from its input-gradient pass until its weight-gradient pass (zero
bubble, Qi et al. 2024): ``Layer.weight_grad_saved_fraction``, measured.

Each layer runs alone on fresh copies of its inputs from one forward of the whole model (the
same cut step the timings use, :mod:`planner.profiling.measured.timing`; the last layer with
its loss), under saved-tensor hooks that hold every save until the autograd node that saved it
is freed, once per storage (parameters and buffers left out, as
:mod:`planner.profiling.measured.memory` counts them). Its backward is then split the way
torch's pipelining runtime splits it, the runtime the planner runs zero-bubble plans on:
``stage_backward_input`` (``I``), then ``stage_backward_weight`` (``W``). The bytes still held
between the two, over the bytes the forward saved, are the layer's fraction.

What torch keeps (``torch.distributed.pipelining._backward``, torch 2.13): ``I`` runs with
``retain_graph=True`` and then detaches the stage's outputs, so the autograd nodes reachable
from the weight gradients' intermediates stay -- everything up to the layer's last weight
GEMM -- and the nodes after it are freed: a GPT block keeps all it saved (nothing after its
second MLP GEMM saves), the head keeps its norm's and GEMM's inputs and frees its loss's
logits. A layer whose inputs take no gradient (the first: the batch) has no ``I`` (torch's
runtime skips it on the first stage and ``W`` runs the whole backward): it keeps everything,
1 with parameters (0 without: it has no ``W``).

Per layer, the profile's fraction, and a stage keeps the sum of its layers' (the cost model's
``keep_bytes``). Inside a stage torch keeps more than a layer alone: the next layer's
intermediates reach back through every node before them, so a layer followed in its stage by a
layer with weights keeps all it saved (the zoo VGG's conv blocks keep 33-40% alone, all inside a
stage); and the first stage keeps everything. So the profile records 1 for every layer but the
model's last, and the last layer's own fraction measured as above: the last layer (with the
loss) is always its stage's last, after every weight GEMM of its stage, so it keeps exactly
that; every other layer keeps at most all it saved. A stage's keep is then exact where every
other layer keeps all it saved as its stage's last (the zoo GPT's blocks, BERT's; measured 1),
and above what torch keeps by the tail of the stage's last layer otherwise (never below).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from planner.models.workload import Workload, split_loss
from planner.profiling.measured.memory import SavedBytesMeter
from planner.profiling.measured.tensors import flatten, fresh_like


def _layer_fraction(workload: Workload, idx: int, received: Any, targets: Any, live: SavedBytesMeter) -> float:
    """What layer ``idx`` keeps alone (module docstring), run on a fresh copy of its inputs ``received``."""
    layer = workload.layers[idx]
    params = [p for p in layer.parameters() if p.requires_grad]
    x = fresh_like(received)
    inputs = [t for t in flatten(x) if t.requires_grad]
    if not inputs:
        return 1.0 if params else 0.0  # no I: W runs the whole backward, everything kept until it
    before = live.live_bytes  # (0: each layer's saves are freed by its W)
    with live.hooks():
        out = layer(x)
        if idx == len(workload.layers) - 1:
            out = split_loss(workload.loss_fn(out, targets))[0]
    saved = live.live_bytes - before
    outputs = [t for t in flatten(out) if t.requires_grad]
    grads = None if idx == len(workload.layers) - 1 else [torch.ones_like(t) for t in outputs]
    del out
    _, groups = stage_backward_input(outputs, grads, inputs, iter(params))
    del outputs, grads
    kept = live.live_bytes - before
    stage_backward_weight(iter(params), groups)
    del groups
    for p in params:
        p.grad = None
    return min(1.0, kept / saved) if saved > 0 else 0.0


def weight_grad_saved_fractions(workload: Workload, inputs: Any, targets: Any) -> list[float | None]:
    """Per layer of ``workload``, the share of its saved bytes a stage keeps of it from its I
    until its W under torch's split backward, at the batch ``inputs``: 1 but for the last
    layer, whose own is measured (module docstring). Where torch cannot split the last layer's
    backward (its ``stage_backward_input`` raises), all are None: the profile's stated default."""
    last = len(workload.layers) - 1
    x = inputs
    for layer in workload.layers[:last]:  # the last layer's input as training hands it on (requires_grad kept;
        x = layer(fresh_like(x))         # each layer's graph dropped with its output)
    live = SavedBytesMeter(t for layer in workload.layers for t in (*layer.parameters(), *layer.buffers()))
    try:
        own = _layer_fraction(workload, last, x, targets, live)
    except RuntimeError:
        return [None] * (last + 1)
    return [1.0] * last + [own]
