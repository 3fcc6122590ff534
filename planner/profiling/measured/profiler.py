"""``profile_model``: a :class:`Workload` measured layer by layer into a :class:`Profile`.

Per micro-batch size, every layer is timed forward and backward within whole training
steps cut at the layer boundaries (warm-up, then the median of repeats, see
:func:`planner.profiling.measured.timing.time_layers`); one more pass at the
largest size measures the activation bytes and the layer DAG exactly (see
:mod:`planner.profiling.measured.memory`). Times are fitted as ``a + b x micro-batch`` per layer.
"""

from __future__ import annotations

import copy
import dataclasses
import platform
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType
from planner.artifacts.profile import Edge, Layer, Profile, TiedParams, TimePoint
from planner.models import layer_param_shapes, workload_fingerprint
from planner.models.common import DTYPES
from planner.models.workload import Workload, split_loss
from planner.profiling.measured.contract import check_layer_contract
from planner.profiling.measured.fit import fit_time
from planner.profiling.measured.memory import layer_edges, measure_layer_bytes
from planner.profiling.measured.tensor_split import layer_splits
from planner.profiling.measured.tensors import to_device
from planner.profiling.measured.timing import Clock, LayerTime, time_layers
from planner.profiling.measured.trace import op_graph

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
) -> Profile:
    """Measure ``workload`` into a Profile (``source="measured"``).

    The layer contract is checked first (:mod:`planner.profiling.measured.contract`): a layer output that
    cannot cross a stage boundary is refused with the layer and the tensor named.

    ``dtype`` (float32 | float64 | bfloat16) converts a copy of the layers and the floating
    inputs; by default the workload's own parameter dtype is kept. ``num_threads`` fixes
    ``torch.set_num_threads`` for the CPU measurements (default: the
    current setting); it is restored afterwards and recorded in the metadata. ``trace_ops``
    traces each layer with torch.fx and records operator counts (untraceable layers warn).
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
    torch_dtype = DTYPES[dtype]
    threads_before = torch.get_num_threads()
    threads = num_threads or threads_before
    torch.set_num_threads(threads)
    try:
        work = _placed(workload, dev, torch_dtype)
        check_layer_contract(work, *to_device(work.make_batch(sizes[0], BATCH_SEED), dev, torch_dtype))
        clock = Clock(dev)
        bar = tqdm(
            total=len(sizes) * len(work.layers) + 1,
            desc=f"profile {work.name}",
            disable=not progress or not sys.stderr.isatty(),
        )
        with bar:
            times = {b: _time_layers(work, b, dev, torch_dtype, clock, warmup, repeats, bar) for b in sizes}
            inputs, targets = to_device(work.make_batch(sizes[-1], BATCH_SEED), dev, torch_dtype)
            layer_bytes = measure_layer_bytes(work, inputs, targets)
            splits = layer_splits(work, inputs, sizes[-1], [b.output_bytes / sizes[-1] for b in layer_bytes])
            edges = layer_edges(work, inputs)
            bar.update(1)
        op_counts = _op_counts(work) if trace_ops else {}
    finally:
        torch.set_num_threads(threads_before)
    per = float(sizes[-1])
    shapes = layer_param_shapes(work)
    layers = []
    for idx, (name, module) in enumerate(zip(work.layer_names, work.layers)):
        points = tuple(TimePoint(microbatch_size=b, fwd_ms=times[b][idx].fwd_ms, bwd_ms=times[b][idx].bwd_ms) for b in sizes)
        params = list(module.parameters())
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
                saved_bytes_per_sample=layer_bytes[idx].saved_bytes / per,
                input_bytes_per_sample=layer_bytes[idx].input_bytes / per,
                output_bytes_per_sample=layer_bytes[idx].output_bytes / per,
                tp=splits[idx],
            )
        )
    metadata: dict[str, Any] = {
        "clock": clock.name,
        "torch_num_threads": threads,
        "warmup": warmup,
        "repeats": repeats,
        "batch_seed": BATCH_SEED,
        "bytes_measured_at_microbatch_size": sizes[-1],
        "saved_bytes": "saved_tensors_hooks, numel*element_size per tensor, parameter aliases excluded",
        "last_layer_includes_loss": True,
        "processor": platform.processor() or platform.machine(),
        **{f"option.{k}": v for k, v in work.options.items() if isinstance(v, (str, int, float, bool))},
        **op_counts,
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
        model_flops_per_sample=work.model_flops_per_sample,
        layers=tuple(layers),
        edges=tuple(Edge(src=s, dst=d, bytes_per_sample=b / per) for (s, d), b in sorted(edges.items())),
        tied=detect_tied(work),
    )


def _time_layers(
    work: Workload, size: int, dev: torch.device, dtype: torch.dtype, clock: Clock, warmup: int, repeats: int, bar: tqdm
) -> list[LayerTime]:
    inputs, targets = to_device(work.make_batch(size, BATCH_SEED), dev, dtype)
    result = time_layers(work.layers, inputs, lambda out: split_loss(work.loss_fn(out, targets))[0], clock, warmup=warmup, repeats=repeats)
    bar.update(len(work.layers))
    return result


def _op_counts(work: Workload) -> dict[str, Any]:
    """torch.fx operator counts per layer; untraceable layers warn and count as one module."""
    graphs = [op_graph(layer, name) for layer, name in zip(work.layers, work.layer_names)]
    untraced = [name for name, g in zip(work.layer_names, graphs) if g is None]
    return {
        "fx_traced_layers": sum(g is not None for g in graphs),
        "fx_untraced_layers": ",".join(untraced),
        "fx_op_nodes": sum(g.number_of_nodes() for g in graphs if g is not None),
    }
