"""The layer contract, checked before anything is measured (``planner profile``,
:func:`planner.profiling.measured.profile_model`).

What crosses a layer boundary is what the runtime sends between stages, so every layer but
the last must return a tensor or a flat tuple of tensors (``torch.distributed.pipelining``
and the planner's executor send the elements of one tuple level), each of a dtype gloo and
NCCL send. Refused, with the layer and the tensor named: a dict (``transformers``'
``ModelOutput`` is one), a list, ``None``, a nested tuple, anything else that is not a tensor,
and complex, quantized or other unsendable dtypes. The batch inputs (``make_batch``) follow
the same rule: stage 0 slices them into micro-batches. The loss must be a scalar tensor (a
mean) or ``(sum, count)`` (``planner.models.workload``).

The batch itself (:func:`check_batch`): ``make_batch(batch_size, seed)`` must return
``batch_size`` samples along dim 0 in every tensor of its inputs and targets, since stage 0
splits the batch into micro-batches along dim 0 and every byte the profile records is per
sample. A factory whose ``make_batch`` takes ``(seed, batch_size)`` (a batch of ``seed``
samples, often none) is refused naming it, and so is a profile in which no layer saves a
single byte for backward (:func:`check_activations`: nothing to train, or a batch of no
samples), which would otherwise be planned as free and fail only under torchrun.

Decided and documented rather than refused:

- a non-contiguous tensor (a transposed view) is accepted: the runtime makes every stage's
  outputs contiguous before sending them (``planner.runtime.stage.StageModule``), which is the
  copy a send needs anyway;
- every floating tensor that crosses a boundary is treated as an activation: the runtime
  receives it as a leaf that requires grad and sends a gradient back (zeros when nothing
  downstream depends on it, as torch's pipelining does), so a floating mask works but costs a
  gradient message; pass masks and ids as bool or integer tensors, which carry no gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from planner.artifacts.errors import PlannerInputError
from planner.models.workload import Workload, split_loss

#: dtypes gloo and NCCL send (``ProcessGroupGloo``'s and NCCL's type lists, torch 2.x)
SENDABLE_DTYPES = frozenset(
    {torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.uint8, torch.int8, torch.int32, torch.int64, torch.bool}
)

CONTRACT = "a layer must return a tensor or a tuple of tensors"


def _describe(value: Any) -> str:
    """What a value is, for a refusal: the type and, for a mapping, its first keys."""
    kind = type(value).__name__
    if isinstance(value, Mapping):
        keys = list(value.keys())
        shown = ", ".join(map(str, keys[:4])) + (", ..." if len(keys) > 4 else "")
        what = "a dict" if type(value) is dict else f"a {kind} (a dict)"
        return f"{what} (keys: {shown})"
    if value is None:
        return "None"
    if isinstance(value, list):
        return f"a list of {len(value)} (use a tuple)"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return f"a {kind}"


def check_value(value: Any, where: str) -> None:
    """Refuse ``value`` unless it is a tensor or a flat tuple of sendable tensors; ``where``
    names it (e.g. "layer 'block_3' returns")."""
    if isinstance(value, torch.Tensor):
        _check_tensor(value, where, "")
        return
    if not isinstance(value, tuple) or isinstance(value, Mapping):
        raise PlannerInputError(f"{where} {_describe(value)}: {CONTRACT}")
    if not value:
        raise PlannerInputError(f"{where} an empty tuple: {CONTRACT}")
    for idx, item in enumerate(value):
        if not isinstance(item, torch.Tensor):
            nested = " (tuples are not nested: flatten it)" if isinstance(item, (tuple, list)) else ""
            raise PlannerInputError(f"{where} a tuple whose element {idx} is {_describe(item)}{nested}: {CONTRACT}")
        _check_tensor(item, where, str(idx))


def _check_tensor(tensor: torch.Tensor, where: str, which: str) -> None:
    if tensor.dtype not in SENDABLE_DTYPES:
        dtype = str(tensor.dtype).removeprefix("torch.")
        allowed = ", ".join(sorted(str(d).removeprefix("torch.") for d in SENDABLE_DTYPES))
        what = f"a tuple whose element {which} is" if which else "a tensor"
        raise PlannerInputError(
            f"{where} {what} of dtype {dtype} {list(tensor.shape)}, which gloo and NCCL cannot send (sendable: {allowed})"
        )


def check_loss(value: Any, name: str) -> None:
    """``loss_fn`` must return a scalar tensor (the mean) or ``(sum, count)`` with a scalar
    tensor sum (:func:`planner.models.workload.split_loss`)."""
    try:
        total, count = split_loss(value)
    except ValueError as exc:
        raise PlannerInputError(f"model {name!r}: {exc}") from None
    if not isinstance(total, torch.Tensor) or total.numel() != 1:
        what = "its sum is" if count is not None else "it is"
        raise PlannerInputError(
            f"model {name!r}: loss_fn must return a scalar tensor (the mean loss) or (sum, count); {what} {_describe(total)}"
            + (f" {list(total.shape)}" if isinstance(total, torch.Tensor) else "")
        )
    if not total.requires_grad:
        raise PlannerInputError(
            f"model {name!r}: the loss does not require a gradient: no parameter of the model reaches it (nothing to train)"
        )
    if count is not None and isinstance(count, torch.Tensor) and count.numel() != 1:
        raise PlannerInputError(f"model {name!r}: loss_fn's count must be a number or a scalar tensor (got shape {list(count.shape)})")


def _tensors(value: Any) -> list[tuple[str, Any]]:
    """(where, tensor) for a tensor or the tensors of a flat tuple / list."""
    if isinstance(value, torch.Tensor):
        return [("", value)]
    if isinstance(value, (tuple, list)):
        return [(f"[{i}]", v) for i, v in enumerate(value) if isinstance(v, torch.Tensor)]
    return []


def check_batch(workload: Workload, batch_size: int, seed: int, batch: Any) -> None:
    """``batch = make_batch(batch_size, seed)`` has ``batch_size`` samples along dim 0 in every
    tensor of its inputs and targets (see the module docstring)."""
    if not isinstance(batch, tuple) or len(batch) != 2:
        raise PlannerInputError(
            f"model {workload.name!r}: make_batch({batch_size}, {seed}) returned {_describe(batch)}; expected (inputs, targets)"
        )
    for part, value in zip(("inputs", "targets"), batch):
        for where, tensor in _tensors(value):
            samples = tensor.shape[0] if tensor.dim() else None
            if samples == batch_size:
                continue
            hint = (" -- make_batch takes (batch_size, seed): are its arguments swapped?"
                    if samples == seed or samples == 0 else "")
            raise PlannerInputError(
                f"model {workload.name!r}: make_batch({batch_size}, {seed}) returned {part}{where} with "
                f"{'no dim 0' if samples is None else f'{samples} samples'} along dim 0 (shape {list(tensor.shape)}), "
                f"expected {batch_size}{hint}"
            )


def check_activations(workload: Workload, saved_bytes: Any) -> None:
    """Refuse a profile in which no layer saves any byte for backward (``saved_bytes``: the
    measured ``LayerBytes`` per layer); see the module docstring."""
    if all(b.saved_bytes == 0 for b in saved_bytes):
        raise PlannerInputError(
            f"model {workload.name!r}: no layer saves a single byte for backward (every activation measured 0 bytes): "
            "a batch of no samples (make_batch(batch_size, seed) must return batch_size samples along dim 0), or "
            "layers without parameters or gradients"
        )


def check_layer_contract(workload: Workload, inputs: Any, targets: Any) -> None:
    """One forward pass (with autograd, as in training) checking the batch inputs, every
    layer output that crosses a boundary (all but the last layer's, which goes to the loss)
    and the loss; raises :class:`PlannerInputError` naming the first layer that breaks the
    contract."""
    check_value(inputs, f"model {workload.name!r}: make_batch returns inputs that are")
    x = inputs
    last = len(workload.layers) - 1
    for idx, (name, layer) in enumerate(zip(workload.layer_names, workload.layers)):
        try:
            x = layer(x)
        except Exception as exc:
            detail = " ".join(str(exc).split())[:300]
            raise PlannerInputError(
                f"layer {name!r} (layer {idx}) raised {type(exc).__name__} on the output of the layer before it: {detail}"
            ) from None
        if idx < last:
            check_value(x, f"layer {name!r} returns")
    try:
        loss = workload.loss_fn(x, targets)
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]
        raise PlannerInputError(
            f"model {workload.name!r}: loss_fn raised {type(exc).__name__} on the last layer's output: {detail}"
        ) from None
    check_loss(loss, workload.name)
