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
  and GeLU count no FLOPs there, though they take time on a CPU;
- ``split_saved_bytes_per_sample``: of the bytes the layer saves for backward (counted as the
  profiler counts them: once per storage, parameters excluded), those that come from a column
  split's output -- each aten op's outputs inherit the lineage of its inputs (a
  ``TorchDispatchMode``), a row split's output starts the hidden stream again -- whatever
  module saves them: the heads' q, k, v, the attention core, the MLP's activations. Not a mask
  built inside the attention (whole on every device), nor a norm that sits in the module
  around a row split (BERT's ``attention.output.LayerNorm``: its input is the stream). For a
  block this is Korthikanti et al.'s split part ``24 s h + 5 a s^2`` of ``s h (34 + 5 a s / h)``
  (16-bit, with dropout) as this block really saves it: in its dtype, without dropout masks,
  with whatever the attention kernel keeps (the CPU's fused attention keeps its output and
  log-sum-exp, not the ``a s^2`` scores);
- ``sequence_saved_bytes_per_sample`` (``sequence_runtime`` torch-dtensor): those from the
  layer's hidden input and not a column split's (norm inputs and statistics, residuals): what
  sequence parallelism splits along the sequence. The rest stays whole on every device: the
  column splits' inputs (each all-gathered and saved whole by torch's ``ColwiseParallel``),
  masks and rotary tables (built from the whole padding mask and positions);
- ``degrees``: at each degree t the heads allow (:func:`split_degrees`), the split bytes device
  0 of t saves, counted on the layer's shard run alone (:func:`device_split_bytes`): ``1/t`` of
  them but where the shapes say otherwise (grouped-query attention with one key/value head per
  device: ``repeat_kv`` makes a view, not a copy);
- ``collective_bytes_per_sample``: the layer's output (one all-reduce of it after the
  attention and one after the MLP in forward, two of its gradient in backward:
  ``collectives_fwd = collectives_bwd = 2`` for a block; one each per attention or MLP layer);
- ``must_divide``: the workload's sizes (attention heads).

Before any figure is counted, one layer of each class and split is computed split over two
emulated devices and compared with the whole layer (:func:`planner.models.tp_check.check_split`),
and run split by torch's own styles over one device (``check_dtensor_split``): a declared or
recognised split that does not compute the layer, or that torch cannot run (a norm whose
plain weight meets the DTensor input of the projections), is refused, naming it.
``collective_bytes_per_sample`` is the bytes of the layer's first output tensor (a Hugging Face
block's hidden states; its padding mask beside them is not reduced).

``tests/test_tp_profile.py`` checks the parameter and saved-byte figures against the block
run sharded over two gloo ranks (``tests/tp_profile_driver.py``): per rank, parameters
``P - S + S / t`` and saved bytes ``(saved - split) + split / t`` exactly, as declared.

Sequence parallelism (``TensorSplit.sequence_runtime`` = torch-dtensor): a rank saves
``(saved - A - Q) + (A + Q) / t``; Megatron-LM instead keeps the sequence shard of each
column-split input and all-gathers it again in backward (Korthikanti et al. 2022 eq. 4: all
``/ t``), which the analytic profiles describe. Measured with ``tests/tp_profile_driver.py`` on
two gloo ranks (h 64, s 32, float64, one block): BERT, GPT-2 exactly as declared with and
without sequence parallelism; the old rule (everything ``/ t``) was 4.2% under (BERT) and the
module-based split (everything saved inside the attention and MLP modules ``/ t``) 13% under
for BERT without sequence parallelism (its norms and the attention mask counted as split).
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.utils._pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from planner.artifacts.kinds import SequenceParallelRuntime
from planner.artifacts.tensor_split import SplitDegree, TensorSplit
from planner.models.tp_check import check_dtensor_split, check_split, shard_copy
from planner.models.workload import Workload
from planner.profiling.measured.memory import saved_span, union_bytes
from planner.profiling.measured.tensors import flatten

__all__ = ["SplitCount", "count_split", "layer_split"]


class SplitCount:
    """What one forward of a layer saves for backward, whole and split (bytes), and its FLOPs."""

    def __init__(self) -> None:
        self.saved_bytes = 0
        self.split_saved_bytes = 0  # derived from a column split's output (the heads): 1/t with or without SP
        self.sequence_saved_bytes = 0  # derived from the hidden stream only: 1/t with sequence parallelism
        self.column_input_bytes = 0  # the whole inputs the column-split linears save (part of the rest)
        self.flops = 0
        self.split_flops = 0
        self.output_bytes = 0  # the layer's output (its first tensor when it returns a tuple)


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


def _storage(tensor: torch.Tensor) -> int | None:
    try:
        return tensor.untyped_storage().data_ptr() if tensor.numel() else None
    except (RuntimeError, NotImplementedError):
        return None


class _Lineage(TorchDispatchMode):
    """Which storages come from what: every aten op's outputs carry the union of its inputs'
    labels (``stream``: the layer's hidden input; ``heads``: a column split's output), so a
    saved tensor is known by where it came from, whatever the module it is saved in (a mask
    built inside the attention is neither; a norm inside the module around a row split is
    stream). Marks set by hooks (:meth:`mark`) override what the op gave."""

    def __init__(self) -> None:
        super().__init__()
        self.labels: dict[int, frozenset[str]] = {}

    def mark(self, value: Any, labels: frozenset[str]) -> None:
        for tensor in flatten(value):
            key = _storage(tensor)
            if key is not None:
                self.labels[key] = labels

    def of(self, tensor: torch.Tensor) -> frozenset[str]:
        key = _storage(tensor)
        return self.labels.get(key, frozenset()) if key is not None else frozenset()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        inputs = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        labels = frozenset().union(*(self.of(t) for t in inputs)) if inputs else frozenset()
        for tensor in pytree.tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and (key := _storage(tensor)) is not None:
                self.labels[key] = labels
        return out


def _part(key: int, labels: frozenset[str], columns: set[int]) -> str:
    """Where a saved storage goes on a tensor-parallel device: ``column`` (a column split's input,
    all-gathered and kept whole with sequence parallelism), ``split`` (the heads: 1/t),
    ``sequence`` (the hidden stream: 1/t with sequence parallelism), ``rest`` (whole)."""
    if key in columns:
        return "column"
    return "split" if "heads" in labels else "sequence" if "stream" in labels else "rest"


def count_split(layer: torch.nn.Module, styles: dict[str, Any], x: Any) -> SplitCount:
    """Run ``layer(x)`` once (with grad) and count its saved bytes and FLOPs, whole and split
    (see the module docstring: each saved storage by its lineage)."""
    cols, rows, parents = _styles_kinds(styles)
    lineage = _Lineage()
    columns: set[int] = set()  # storages of the inputs of the column-split linears
    handles = []
    for path, module in layer.named_modules():
        if path in cols:

            def pre(mod: Any, args: Any) -> None:
                key = _storage(args[0])
                if key is not None:
                    columns.add(key)

            handles += [module.register_forward_pre_hook(pre),
                        module.register_forward_hook(lambda mod, args, out: lineage.mark(out, frozenset({"heads"})))]
        elif path in rows:  # reduced (with sequence parallelism: reduce-scattered back onto the stream)
            handles.append(module.register_forward_hook(lambda mod, args, out: lineage.mark(out, frozenset({"stream"}))))
    params = {p.untyped_storage().data_ptr() for p in (*layer.parameters(), *layer.buffers()) if p.numel()}
    spans: dict[int, tuple[set[str], list[tuple[int, int]]]] = {}  # storage -> (parts, byte intervals)

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        span = saved_span(tensor)
        if span is None or span[0] in params:
            return tensor
        entry = spans.setdefault(span[0], (set(), []))
        entry[0].add(_part(span[0], lineage.of(tensor), columns))
        entry[1].append((span[1], span[2]))
        return tensor

    first = next(iter(flatten(x)), None)
    out = SplitCount()
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), FlopCounterMode(display=False) as flops, \
                lineage:
            if first is not None and first.is_floating_point():
                lineage.mark(first, frozenset({"stream"}))
            result = layer(x)
        head = result[0] if isinstance(result, tuple) else result
        out.output_bytes = head.numel() * head.element_size() if isinstance(head, torch.Tensor) else 0
    finally:
        for handle in handles:
            handle.remove()
    for parts, intervals in spans.values():
        nbytes = union_bytes(intervals)
        part = next(p for p in ("column", "split", "sequence", "rest") if p in parts)
        out.saved_bytes += nbytes
        out.column_input_bytes += nbytes if part == "column" else 0
        out.split_saved_bytes += nbytes if part == "split" else 0
        out.sequence_saved_bytes += nbytes if part == "sequence" else 0
    counts = flops.get_flop_counts()
    root = type(layer).__name__
    out.flops = flops.get_total_flops()
    out.split_flops = sum(sum(counts.get(f"{root}.{path}", {}).values()) for path in parents)
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
    emulated devices and compared with the whole layer (:func:`planner.models.tp_check.check_split`:
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
        check_dtensor_split(layer, spec.styles, x, workload.layer_names[layer_idx])
        checked.add(key)
    count = count_split(layer, styles, x)
    _, rows, _ = _styles_kinds(styles)
    degrees = tuple(
        SplitDegree(degree=t, time_scale=1.0, split_saved_bytes_per_sample=device_split_bytes(
            layer, spec, kinds, x, t, workload.layer_names[layer_idx]) / batch_size)
        for t in split_degrees(spec.must_divide)
    )
    return TensorSplit(
        must_divide=tuple(spec.must_divide),
        split_time_fraction=count.split_flops / count.flops if count.flops else 1.0,
        split_param_count=split_param_count(layer, styles),
        split_saved_bytes_per_sample=count.split_saved_bytes / batch_size,
        sequence_runtime=SequenceParallelRuntime.DTENSOR,
        sequence_saved_bytes_per_sample=count.sequence_saved_bytes / batch_size,
        # what the row splits all-reduce: the layer's (first) output tensor, not a mask carried beside it
        collective_bytes_per_sample=count.output_bytes / batch_size if count.output_bytes else output_bytes_per_sample,
        collectives_fwd=len(rows),
        collectives_bwd=len(rows),
        degrees=degrees,
    )


#: the largest tensor-parallel degree a measured profile runs a layer's shard at (a node's GPUs)
MAX_MEASURED_DEGREE = 8


def split_degrees(must_divide: tuple[int, ...]) -> tuple[int, ...]:
    """The degrees a measured split is run at: every t >= 2 dividing all ``must_divide`` sizes
    (the heads), up to :data:`MAX_MEASURED_DEGREE`."""
    if not must_divide:
        return ()
    common = math.gcd(*must_divide)
    return tuple(t for t in range(2, min(common, MAX_MEASURED_DEGREE) + 1) if common % t == 0)


def device_split_bytes(layer: torch.nn.Module, spec: Any, kinds: dict[str, str], x: Any, t: int, name: str) -> int:
    """What device 0 of ``t`` saves of the layer's split bytes in one forward of its shard on
    ``x`` (:func:`planner.models.tp_check.shard_copy`; counted as :func:`count_split` counts)."""
    twin = shard_copy(layer, kinds, 0, t, name)
    return count_split(twin, spec.styles(twin, False), x).split_saved_bytes


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
