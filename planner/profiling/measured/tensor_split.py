"""``Layer.tp`` of a measured layer: how it splits over tensor-parallel devices, from the
layer's own modules and the split the workload declares (``Workload.tensor_parallel``).

Megatron-LM's split (Shoeybi et al. 2019) with activations after Korthikanti et al. 2022,
applied to the actual module structure rather than to the formula's idealised block:

- ``split_param_count``: the parameters the ``parallelize_module`` plan shards: the weight and
  bias of every ``ColwiseParallel`` linear, the weight of every ``RowwiseParallel`` one (its
  bias is replicated, added once after the reduction); layer norms stay whole;
- ``split_time_fraction``: the FLOP share of the modules the plan splits (the attention and
  MLP, counted with ``torch.utils.flop_counter.FlopCounterMode`` in one forward): all of a
  transformer block's matmuls, so 1.0 for the zoo blocks -- the layer norms, residual adds
  and GeLU count no FLOPs there, though they take time on a CPU; of a mixture-of-experts layer,
  the share of its FLOPs without its routed experts' (``Layer.moe`` prices those);
- ``split_saved_bytes_per_sample``: of the bytes the layer saves for backward (counted as the
  profiler counts them: once per storage, parameters excluded, each storage in the part where
  it is first saved), those saved inside the split modules except the inputs of the
  column-parallel linears (each device keeps the whole input of a column split). For a block
  this is Korthikanti et al.'s split part ``24 s h + 5 a s^2`` of ``s h (34 + 5 a s / h)``
  (16-bit, with dropout) as this block really saves it: in its dtype, without dropout masks,
  with whatever the attention kernel keeps (the CPU's fused attention keeps its output and
  log-sum-exp, not the ``a s^2`` scores), and with the column-split input once (q, k and v
  each save it: one storage);
- ``collective_bytes_per_sample``: the layer's output (one all-reduce of it after the
  attention and one after the MLP in forward, two of its gradient in backward:
  ``collectives_fwd = collectives_bwd = 2`` for a block; one each per attention or MLP layer);
- ``must_divide``: the workload's sizes (attention heads).

Before any figure is counted, one layer of each class and split is computed split over two
emulated devices and compared with the whole layer (:func:`planner.models.tp_plans.check_split`):
a declared or recognised split that does not compute the layer is refused, naming it.
``collective_bytes_per_sample`` is the bytes of the layer's first output tensor (a Hugging Face
block's hidden states; its padding mask beside them is not reduced).

``tests/test_tp_profile.py`` checks the parameter and saved-byte figures against the block
run sharded over two gloo ranks (``tests/tp_profile_driver.py``): per rank, parameters
``P - S + S / t`` and saved bytes ``(saved - split) + split / t`` exactly, as declared.

Sequence parallelism: the cost model divides everything saved by t (Korthikanti et al. 2022
eq. 4: Megatron keeps the sequence shard of each column-split input and all-gathers it again
in backward). The runtime's DTensor split keeps the all-gathered input of every
column-parallel linear whole instead, so a rank saves ``saved / t + column_inputs (1 - 1/t)``
(``SplitCount.column_input_bytes``; measured: zoo GPT block h 32, s 8, t 2: 23,808 bytes per
rank against 19,712 declared, +21%; the same +21% at h 128, s 64).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.flop_counter import FlopCounterMode

from planner.artifacts.tensor_split import TensorSplit
from planner.models.experts import RoutedExperts
from planner.models.tp_plans import check_split
from planner.models.workload import Workload
from planner.profiling.measured.memory import saved_span, union_bytes

__all__ = ["SplitCount", "count_split", "layer_split"]


class SplitCount:
    """What one forward of a layer saves for backward, whole and split (bytes), and its FLOPs."""

    def __init__(self) -> None:
        self.saved_bytes = 0
        self.split_saved_bytes = 0
        self.column_input_bytes = 0  # the whole inputs the column-split linears save (part of the rest)
        self.flops = 0
        self.split_flops = 0
        self.output_bytes = 0  # the layer's output (its first tensor when it returns a tuple)
        self.expert_flops = 0  # of ``flops``, the routed experts' (laid out apart: ``Layer.moe``)


def _styles_kinds(styles: dict[str, Any]) -> tuple[set[str], set[str], set[str]]:
    """Paths of the column-split linears, row-split linears, and the modules around them."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    cols = {path for path, style in styles.items() if isinstance(style, ColwiseParallel)}
    rows = {path for path, style in styles.items() if isinstance(style, RowwiseParallel)}
    parents = {path.rpartition(".")[0] for path in cols | rows}
    return cols, rows, parents


def split_param_count(layer: torch.nn.Module, styles: dict[str, Any]) -> int:
    """Parameters the plan shards: column-split weights and biases, row-split weights."""
    cols, rows, _ = _styles_kinds(styles)
    count = 0
    for path in cols:
        count += sum(p.numel() for p in layer.get_submodule(path).parameters(recurse=False))
    for path in rows:
        count += layer.get_submodule(path).weight.numel()
    return count


def count_split(layer: torch.nn.Module, styles: dict[str, Any], x: Any) -> SplitCount:
    """Run ``layer(x)`` once (with grad) and count its saved bytes and FLOPs, whole and split."""
    cols, _, parents = _styles_kinds(styles)
    modules = dict(layer.named_modules())
    params = {p.untyped_storage().data_ptr() for p in (*layer.parameters(), *layer.buffers()) if p.numel()}
    stack: list[str] = []
    col_inputs: list[int] = []  # storages of the inputs of the column-split linears running now
    out = SplitCount()
    handles = []
    for path, module in modules.items():
        if path in parents or path in cols:

            def pre(mod: Any, args: Any, path: str = path) -> None:
                stack.append(path)
                if path in cols:
                    col_inputs.append(args[0].untyped_storage().data_ptr())

            def post(mod: Any, args: Any, result: Any, path: str = path) -> None:
                stack.pop()
                if path in cols:
                    col_inputs.pop()

            handles += [module.register_forward_pre_hook(pre), module.register_forward_hook(post)]

    spans: dict[int, tuple[str, list[tuple[int, int]]]] = {}  # storage -> (part, byte intervals)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        span = saved_span(tensor)
        if span is None or span[0] in params:
            return tensor
        part = "column" if col_inputs and span[0] == col_inputs[-1] else "split" if stack else "rest"
        spans.setdefault(span[0], (part, []))[1].append((span[1], span[2]))
        return tensor

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), FlopCounterMode(display=False) as flops:
            result = layer(x)
        first = result[0] if isinstance(result, tuple) else result
        out.output_bytes = first.numel() * first.element_size() if isinstance(first, torch.Tensor) else 0
    finally:
        for handle in handles:
            handle.remove()
    for part, intervals in spans.values():
        nbytes = union_bytes(intervals)
        out.saved_bytes += nbytes
        out.column_input_bytes += nbytes if part == "column" else 0
        out.split_saved_bytes += nbytes if part == "split" else 0
    counts = flops.get_flop_counts()
    root = type(layer).__name__
    out.flops = flops.get_total_flops()
    out.split_flops = sum(sum(counts.get(f"{root}.{path}", {}).values()) for path in parents)
    experts = [path for path, module in modules.items() if isinstance(module, RoutedExperts)]
    out.expert_flops = sum(sum(counts.get(f"{root}.{path}", {}).values()) for path in experts)
    return out


def split_kinds(styles: dict[str, Any]) -> dict[str, str]:
    """A ``parallelize_module`` plan as path -> kind (``colwise``, ``colwise_qkv``, ``rowwise``)."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    kinds = {}
    for path, style in styles.items():
        if isinstance(style, ColwiseParallel):
            kinds[path] = "colwise_qkv" if getattr(style, "parts", 1) == 3 else "colwise"
        elif isinstance(style, RowwiseParallel):
            kinds[path] = "rowwise"
    return kinds


def layer_split(
    workload: Workload, layer_idx: int, x: Any, batch_size: int, output_bytes_per_sample: float,
    checked: set[Any] | None = None,
) -> TensorSplit | None:
    """The layer's :class:`TensorSplit` from one forward on its input ``x`` of ``batch_size``
    samples; None when the workload does not split it. The split is first computed over two
    emulated devices and compared with the whole layer (:func:`planner.models.tp_plans.check_split`:
    a plan that does not compute the layer is refused), once per layer class and split in
    ``checked``."""
    checked = set() if checked is None else checked
    spec = workload.tensor_parallel
    if spec is None:
        return None
    layer = workload.layers[layer_idx]
    styles = spec.styles(layer, False)
    if not styles:
        return None
    x = tuple(t.detach().requires_grad_(t.is_floating_point()) for t in x) if isinstance(x, tuple) else (
        x.detach().requires_grad_(x.is_floating_point())
    )
    kinds = split_kinds(styles)
    key = (type(layer), tuple(sorted(kinds.items())))
    if key not in checked:  # one layer of each kind and split: the others are alike
        check_split(layer, kinds, x, workload.layer_names[layer_idx])
        checked.add(key)
    count = count_split(layer, styles, x)
    rest_flops = count.flops - count.expert_flops  # an MoE layer's split describes the layer without its routed experts
    _, rows, _ = _styles_kinds(styles)
    return TensorSplit(
        must_divide=tuple(spec.must_divide),
        split_time_fraction=count.split_flops / rest_flops if rest_flops else 1.0,
        split_param_count=split_param_count(layer, styles),
        split_saved_bytes_per_sample=count.split_saved_bytes / batch_size,
        # what the row splits all-reduce: the layer's (first) output tensor, not a mask carried beside it
        collective_bytes_per_sample=count.output_bytes / batch_size if count.output_bytes else output_bytes_per_sample,
        collectives_fwd=len(rows),
        collectives_bwd=len(rows),
    )


def layer_splits(workload: Workload, inputs: Any, batch_size: int, output_bytes_per_sample: list[float]) -> list[TensorSplit | None]:
    """:func:`layer_split` of every layer, each on the output of the layers before it on
    ``inputs`` (``batch_size`` samples); all None when the workload declares no split."""
    if workload.tensor_parallel is None:
        return [None] * len(workload.layers)
    out: list[TensorSplit | None] = []
    x = inputs
    checked: set[Any] = set()
    for idx, layer in enumerate(workload.layers):
        out.append(layer_split(workload, idx, x, batch_size, output_bytes_per_sample[idx], checked))
        with torch.no_grad():
            x = layer(x)
    return out
