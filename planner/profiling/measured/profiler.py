"""``profile_model``: a :class:`Workload` measured layer by layer into a :class:`Profile`.

Per micro-batch size, every layer is timed forward and backward within whole training
steps cut at the layer boundaries (warm-up, then the median of repeats, see
:func:`planner.profiling.measured.timing.time_layers`), and so are its attention cores (their
forward is what selective recomputation costs, :mod:`planner.profiling.measured.cores`); the
bytes each layer saves for backward are counted exactly at every size, once per storage, with
and without its attention cores recomputed, with the storages two layers share
(:mod:`planner.profiling.measured.memory`); the layer DAG at the largest size; the routed
experts' share of a mixture-of-experts layer (``Layer.moe``, :mod:`planner.profiling.measured.experts`). Times and saved
bytes are fitted as ``a + b x micro-batch`` per layer (saved bytes that do not grow with the
micro-batch are an intercept); input and output bytes scale with it.
"""

from __future__ import annotations

import copy
import dataclasses
import platform
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import AttentionKind, DType
from planner.artifacts.moe import MoeLayer
from planner.artifacts.profile import AttentionCore, Edge, Layer, Profile, SharedSaved, TiedParams, TimeFit, TimePoint
from planner.artifacts.progress import Progress
from planner.artifacts.tensor_split import TensorSplit
from planner.models import layer_param_names, layer_param_shapes, workload_fingerprint
from planner.models.common import DTYPES
from planner.models.workload import Workload, split_loss
from planner.profiling.measured.contract import check_activations, check_batch, check_layer_contract
from planner.profiling.measured.cores import core_backend, record_cores, time_cores
from planner.profiling.measured.experts import measure_experts
from planner.profiling.measured.fit import fit_bytes, fit_time
from planner.profiling.measured.memory import ModelBytes, layer_edges, measure_model_bytes
from planner.profiling.measured.tensor_split import layer_splits
from planner.profiling.measured.tensors import to_device
from planner.profiling.measured.timing import Clock, LayerTime, time_layers
from planner.profiling.measured.trace import op_graph
from planner.profiling.measured.wgrad import weight_grad_saved_fractions

BATCH_SEED = 0


def detect_tied(workload: Workload) -> tuple[TiedParams, ...]:
    """Parameters that are the same ``Parameter`` object in two or more layers."""
    owners: dict[int, tuple[str, torch.nn.Parameter, list[int]]] = {}
    for idx, layer in enumerate(workload.layers):
        for pname, param in layer.named_parameters():
            _, _, layers = owners.setdefault(id(param), (f"{workload.layer_names[idx]}.{pname}", param, []))
            if idx not in layers:
                layers.append(idx)
    return tuple(
        TiedParams(name=name, layers=tuple(layers), param_count=p.numel(), param_bytes=p.numel() * p.element_size())
        for name, p, layers in owners.values()
        if len(layers) > 1
    )


def _placed(workload: Workload, device: torch.device, dtype: torch.dtype) -> Workload:
    """The workload on ``device`` in ``dtype``; the layers are copied (together, so tied
    parameters stay tied) only when they must move or change dtype."""
    params = [p for layer in workload.layers for p in layer.parameters()]
    if all(p.device == device and (p.dtype == dtype or not p.is_floating_point()) for p in params):
        return workload
    layers = copy.deepcopy(workload.layers)
    return dataclasses.replace(workload, layers=tuple(m.to(device=device, dtype=dtype) for m in layers))


def _own_dtype(workload: Workload) -> str:
    """Name of the workload's floating parameter dtype (float32 when it has none)."""
    names = {v: k for k, v in DTYPES.items()}
    for layer in workload.layers:
        for p in layer.parameters():
            if p.is_floating_point():
                return names.get(p.dtype, str(p.dtype))
    return "float32"


def _device(name: str) -> torch.device:
    if name not in ("cpu", "cuda"):
        raise PlannerInputError(f"device must be 'cpu' or 'cuda' (got {name!r})")
    if name == "cuda" and not torch.cuda.is_available():
        raise PlannerInputError("device 'cuda' requested but torch.cuda.is_available() is False")
    return torch.device(name)


def _versions() -> dict[str, str]:
    from planner import __version__

    return {
        "planner": __version__,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "numpy": np.__version__,
    }


def profile_model(
    workload: Workload,
    *,
    microbatch_sizes: Sequence[int] = (1, 2, 4),
    device: str = "cpu",
    dtype: str | None = None,
    warmup: int = 2,
    repeats: int = 5,
    num_threads: int | None = None,
    trace_ops: bool = True,
    progress: bool = True,
    verbose: bool = False,
) -> Profile:
    """Measure ``workload`` into a Profile (``source="measured"``).

    The layer contract is checked first (:mod:`planner.profiling.measured.contract`): a layer output that
    cannot cross a stage boundary is refused with the layer and the tensor named.

    ``dtype`` (float32 | float64 | bfloat16) converts a copy of the layers and the floating
    inputs; by default the workload's own parameter dtype is kept. ``num_threads`` fixes
    ``torch.set_num_threads`` for the CPU measurements (default: the
    current setting); it is restored afterwards and recorded in the metadata. ``trace_ops``
    traces each layer with torch.fx and records operator counts (the untraceable layers are
    named in the metadata; ``verbose`` warns of each too).
    """
    sizes = sorted(set(int(b) for b in microbatch_sizes))
    if not sizes or sizes[0] < 1:
        raise PlannerInputError(f"micro-batch sizes must be positive integers (got {list(microbatch_sizes)})")
    dtype = dtype or _own_dtype(workload)
    if dtype not in DTYPES:
        raise PlannerInputError(f"dtype must be one of {sorted(DTYPES)} (got {dtype!r})")
    if warmup < 0 or repeats < 1:
        raise PlannerInputError(f"need warmup >= 0 and repeats >= 1 (got {warmup}, {repeats})")
    dev = _device(device)
    threads_before = torch.get_num_threads()
    threads = num_threads or threads_before
    torch.set_num_threads(threads)
    try:
        work = _placed(workload, dev, DTYPES[dtype])
        got = _measure(work, sizes, dev, DTYPES[dtype], warmup=warmup, repeats=repeats,
                       trace_ops=trace_ops, progress=progress, verbose=verbose)
    finally:
        torch.set_num_threads(threads_before)
    per = float(sizes[-1])
    metadata: dict[str, Any] = {
        "clock": got.clock.name,
        "torch_num_threads": threads,
        "warmup": warmup,
        "repeats": repeats,
        "batch_seed": BATCH_SEED,
        "bytes_measured_at_microbatch_size": sizes[-1],
        "saved_bytes": "saved_tensors_hooks, once per storage (union of the spans saved), parameters and buffers "
                       "excluded; fitted a + b x micro-batch over the measured sizes",
        "sdpa_kernel": got.kernel,
        "last_layer_includes_loss": True,
        "processor": platform.processor() or platform.machine(),
        **{f"option.{k}": v for k, v in work.options.items() if isinstance(v, (str, int, float, bool))},
        **got.op_counts,
    }
    if dev.type == "cuda":
        metadata["device_name"] = torch.cuda.get_device_name(dev)
    return Profile(
        model=work.name,
        source="measured",
        device=torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu",
        dtype=DType(dtype),
        microbatch_sizes=tuple(sizes),
        versions=_versions(),
        metadata=metadata,
        fingerprint_sha256=workload_fingerprint(work),
        model_config=dict(work.model_config),
        model_flops_per_sample=work.model_flops_per_sample,
        attention=got.attention,
        layers=_layers(work, sizes, got),
        edges=tuple(Edge(src=s, dst=d, bytes_per_sample=b / per) for (s, d), b in sorted(got.edges.items())),
        tied=detect_tied(work),
        shared_saved=_shared(sizes, got.by_size),
    )


@dataclasses.dataclass(frozen=True, slots=True)
class _Measured:
    """What :func:`_measure` took from the workload, per micro-batch size where it varies."""

    clock: Clock
    times: dict[int, list[LayerTime]]
    core_ms: dict[int, list[float]]
    by_size: dict[int, ModelBytes]
    attention: AttentionKind
    kernel: str
    moe: list[MoeLayer | None]
    kept: list[float | None]  # what W keeps (torch's split backward), per layer
    splits: list[TensorSplit | None]
    edges: dict[tuple[int, int], int]
    op_counts: dict[str, Any]


def _measure(work: Workload, sizes: list[int], dev: torch.device, torch_dtype: torch.dtype, *, warmup: int,
             repeats: int, trace_ops: bool, progress: bool, verbose: bool) -> _Measured:
    """Every measurement of ``work`` a profile is built from: the layer contract checked first,
    then times, attention cores and saved bytes per size, the experts, what W keeps, tensor
    splits, the layer DAG and (``trace_ops``) operator counts."""
    check_layer_contract(work, *to_device(_batch(work, sizes[0]), dev, torch_dtype))
    clock = Clock(dev)
    # a bar on a terminal, else a line every few seconds (planner.artifacts.progress)
    bar = Progress(f"profile {work.name}", total=len(sizes) * len(work.layers) + 1, unit="layer timings", enabled=progress)
    with bar:
        times = {b: _time_layers(work, b, dev, torch_dtype, clock, warmup, repeats, bar) for b in sizes}
        bar.detail = "attention cores and activation bytes"
        core_ms, by_size = {}, {}
        for b in sizes:
            batch = to_device(_batch(work, b), dev, torch_dtype)
            calls = record_cores(work, batch[0])
            core_ms[b] = time_cores(calls, clock, warmup=warmup, repeats=repeats)
            by_size[b] = measure_model_bytes(work, *batch)
        attention, kernel = core_backend(calls, work, batch[0])
        element_bytes = torch.empty(0, dtype=torch_dtype).element_size()
        batches = {b: to_device(_batch(work, b), dev, torch_dtype)[0] for b in sizes}
        layer_ms = {b: [(t.fwd_ms, t.bwd_ms) for t in times[b]] for b in sizes}
        moe = measure_experts(work, batches, by_size, layer_ms, clock, warmup=warmup, repeats=repeats,
                              element_bytes=element_bytes)
        inputs, targets = to_device(_batch(work, sizes[-1]), dev, torch_dtype)
        kept = weight_grad_saved_fractions(work, inputs, targets)
        layer_bytes = by_size[sizes[-1]].layers
        check_activations(work, layer_bytes)
        splits = layer_splits(work, inputs, sizes[-1], [b.output_bytes / sizes[-1] for b in layer_bytes])
        edges = layer_edges(work, inputs)
        bar.update(1, detail="torch.fx operator counts" if trace_ops else None)
        op_counts = _op_counts(work, verbose) if trace_ops else {}
    return _Measured(clock=clock, times=times, core_ms=core_ms, by_size=by_size, attention=attention, kernel=kernel,
                     moe=list(moe), kept=list(kept), splits=list(splits), edges=edges, op_counts=op_counts)


def _layers(work: Workload, sizes: list[int], got: _Measured) -> tuple[Layer, ...]:
    """The profile's layers: times and saved bytes fitted over the sizes, the rest at the largest."""
    per = float(sizes[-1])
    layer_bytes = got.by_size[sizes[-1]].layers
    shapes, names = layer_param_shapes(work), layer_param_names(work)
    layers = []
    for idx, (name, module) in enumerate(zip(work.layer_names, work.layers)):
        points = tuple(TimePoint(microbatch_size=b, fwd_ms=got.times[b][idx].fwd_ms, bwd_ms=got.times[b][idx].bwd_ms)
                       for b in sizes)
        params = list(module.parameters())
        fixed, per_sample = fit_bytes(sizes, [got.by_size[b].layers[idx].saved_bytes for b in sizes])
        layers.append(
            Layer(
                name=name,
                kind=type(module).__name__,
                fwd=fit_time(sizes, [p.fwd_ms for p in points]),
                bwd=fit_time(sizes, [p.bwd_ms for p in points]),
                measured=points,
                param_count=sum(p.numel() for p in params),
                param_bytes=sum(p.numel() * p.element_size() for p in params),
                param_shapes=shapes[idx],
                param_names=names[idx],
                saved_bytes_per_sample=per_sample,
                saved_bytes_fixed=fixed,
                input_bytes_per_sample=layer_bytes[idx].input_bytes / per,
                output_bytes_per_sample=layer_bytes[idx].output_bytes / per,
                tp=got.splits[idx],
                weight_grad_fraction=_wgrad_fraction(got.times[sizes[-1]][idx]),
                weight_grad_saved_fraction=got.kept[idx],
                attention_core=_core(sizes, got.by_size, got.core_ms, idx, (fixed, per_sample), got.moe[idx]),
                moe=got.moe[idx],
            )
        )
    return tuple(layers)


def _core(
    sizes: list[int], by_size: dict[int, ModelBytes], core_ms: dict[int, list[float]], idx: int,
    saved: tuple[float, float], moe: MoeLayer | None = None,
) -> AttentionCore | None:
    """The layer's attention core: the bytes its selective level frees (saved less saved with
    the cores recomputed, fitted) and its cores' forward time (fitted); None without cores. A
    layer with routed experts: its selective level is Megatron's ``moe_act`` + ``layernorm``
    (``planner.models.moe.MoEBlock``), so the bytes are what that level frees and the time its
    re-run (``moe.recompute_fwd``), not the attention's."""
    if by_size[sizes[0]].layers[idx].selective_saved_bytes < 0:
        return None
    freed = [by_size[b].layers[idx].saved_bytes - by_size[b].layers[idx].selective_saved_bytes for b in sizes]
    fixed, per_sample = fit_bytes(sizes, freed)
    times = [core_ms[b][idx] for b in sizes]
    if moe is not None:
        fwd = moe.recompute_fwd
    else:
        fwd = fit_time(sizes, times) if any(times) else TimeFit(intercept_ms=0.0, per_sample_ms=0.0)
    return AttentionCore(saved_bytes_per_sample=min(per_sample, saved[1]), saved_bytes_fixed=min(fixed, saved[0]), fwd=fwd)


def _shared(sizes: list[int], by_size: dict[int, ModelBytes]) -> tuple[SharedSaved, ...]:
    """The storages two layers both save, fitted over the sizes; a pair found at some sizes only
    (the batch's token ids and targets, views of one tensor when a micro-batch is one sample)
    is left out: counted twice, never under-counted."""
    pairs = sorted(set.intersection(*(set(by_size[b].shared) for b in sizes)))
    out = []
    for first, second in pairs:
        fixed, per_sample = fit_bytes(sizes, [by_size[b].shared.get((first, second), 0) for b in sizes])
        out.append(SharedSaved(first=first, second=second, bytes_per_sample=per_sample, bytes_fixed=fixed))
    return tuple(out)


def _wgrad_fraction(t: LayerTime) -> float | None:
    """W's share of a layer's backward at the largest micro-batch measured: what the backward
    takes beyond its input-gradient pass alone (:func:`time_input_grads`), clamped to [0, 1]
    (timing noise). What W keeps alive is measured apart
    (:func:`planner.profiling.measured.wgrad.weight_grad_saved_fractions`)."""
    if t.bwd_input_ms is None or t.bwd_ms <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - t.bwd_input_ms / t.bwd_ms))


def _time_layers(
    work: Workload, size: int, dev: torch.device, dtype: torch.dtype, clock: Clock, warmup: int, repeats: int, bar: Progress
) -> list[LayerTime]:
    bar.detail = f"timing micro-batch {size}"
    inputs, targets = to_device(_batch(work, size), dev, dtype)
    result = time_layers(work.layers, inputs, lambda out: split_loss(work.loss_fn(out, targets))[0], clock, warmup=warmup, repeats=repeats)
    bar.update(len(work.layers))
    return result


def _batch(work: Workload, size: int) -> Any:
    """``make_batch(size, BATCH_SEED)``, its samples along dim 0 checked (:func:`check_batch`)."""
    try:
        batch = work.make_batch(size, BATCH_SEED)
    except Exception as exc:
        detail = " ".join(str(exc).split())[:300]
        raise PlannerInputError(f"model {work.name!r}: make_batch({size}, {BATCH_SEED}) raised {type(exc).__name__}: {detail}") from None
    check_batch(work, size, BATCH_SEED, batch)
    return batch


def _op_counts(work: Workload, verbose: bool = False) -> dict[str, Any]:
    """torch.fx operator counts per layer; untraceable layers count as one module (and warn
    when ``verbose``)."""
    graphs = [op_graph(layer, name, warn=verbose) for layer, name in zip(work.layers, work.layer_names)]
    untraced = [name for name, g in zip(work.layer_names, graphs) if g is None]
    return {
        "fx_traced_layers": sum(g is not None for g in graphs),
        "fx_untraced_layers": ",".join(untraced),
        "fx_op_nodes": sum(g.number_of_nodes() for g in graphs if g is not None),
    }
