"""A stage module: the plan's layer range and its recomputation.

The layers are the workload's own modules (``Workload.layers[start:stop]``), registered as
``layers.<k>`` so a stage's ``state_dict`` is the layers' state in order. Layer ``i`` takes
the output of layer ``i - 1`` as one argument (a tensor or a tuple of tensors, as the zoo
does); the stage's inputs arrive from ``torch.distributed.pipelining`` as ``*args``. The
stage's outputs are made contiguous (they are sent to the next stage).

Activation offload (the plan's ``stages[i].offload_layers``): an offloaded layer runs under
host copies of its saved tensors (:meth:`StageModule._offloading`).

Recompute levels (the plan's ``stages[i].recompute`` and ``recompute_selective``): a fully
recomputed layer runs under non-reentrant ``torch.utils.checkpoint``, except under a split
backward (ZB-H1, ZB-H2, ZBV, DualPipe-V: ``split_backward``), where the stage recomputes it
itself, once in ``I``, kept until ``W`` (:mod:`planner.runtime.recompute`); a selectively recomputed
one has its attention cores switched to run under it (:mod:`planner.models.selective`: QK^T,
softmax and attention over V re-run in backward, the rest kept, Korthikanti et al. 2022 sec. 4).

Saved bytes are metered while the stage's forward runs, when ``metering`` is on (the engine
meters the first step of a run only: shapes do not change between steps, and the Python hooks
would otherwise cost host time in every timed step): per forward a
:class:`~planner.runtime.memory.ForwardRecord` with the meter's count and, in the same window,
the allocator's (:class:`~planner.runtime.memory.AllocatorProbe`).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from planner.models.selective import set_selective
from planner.profiling.measured.memory import saved_span, union_bytes
from planner.profiling.measured.tensors import flatten
from planner.runtime.memory import AllocatorProbe, ForwardRecord, StageMeter, storage_keys
from planner.runtime.recompute import RecomputeLedger
from planner.runtime.tensor import local


class StageModule(nn.Module):
    def __init__(
        self,
        layers: Sequence[nn.Module],
        recompute: Sequence[bool],
        selective: Sequence[bool] = (),
        offload: Sequence[bool] = (),
        split_backward: bool = False,
    ) -> None:
        super().__init__()
        if len(recompute) != len(layers) or any(flags and len(flags) != len(layers) for flags in (selective, offload)):
            raise ValueError("one recompute flag (and one selective flag, one offload flag) per layer")
        self.layers = nn.ModuleList(layers)
        self.recompute = tuple(recompute)
        self.selective = tuple(selective) or (False,) * len(layers)
        self.offload = tuple(offload) or (False,) * len(layers)
        for layer, on in zip(self.layers, self.selective):
            set_selective(layer, on)
        self.meter = StageMeter([*self.parameters(), *self.buffers()])
        self.metering = True  # saved-tensor hooks on; the engine turns them off after the first step
        self.probe: AllocatorProbe | None = None  # set by the runner for the metered step
        self.records: list[ForwardRecord] = []
        self._consumed: dict[int, weakref.ref[torch.Tensor]] = {}  # tensors a layer of the stage took as input
        # under a split backward the stage recomputes its layers itself (planner.runtime.recompute)
        self.ledger = RecomputeLedger(self._recompute_hooks) if split_backward and any(self.recompute) else None

    def _recompute_hooks(self) -> contextlib.AbstractContextManager[Any]:
        """The meter around a recomputation in backward (what it rebuilds is held until W)."""
        return self.meter.hooks() if self.metering else contextlib.nullcontext()

    def weights_moved(self) -> None:
        """The parameters' storage was allocated anew (ZeRO 3 gathered them): the meter re-reads it."""
        self.meter.weights_moved()

    def consumed(self, tensor: torch.Tensor) -> bool:
        """``tensor`` was an input of one of the stage's layers (a skip it also hands on): a
        checkpointed layer may still need it, so it is not the executor's to free."""
        ref = self._consumed.get(id(tensor))
        return ref is not None and ref() is tensor

    def _offloading(self, on: bool, x: Any) -> contextlib.AbstractContextManager[Any]:
        """The layer's saved activations kept in host memory until its backward (the plan's
        ``offload_layers``, Megatron-Core's fine-grained activation offloading): each saved
        tensor copied into a host buffer when autograd saves it (pinned when the layer runs on a
        GPU; a separate buffer on a CPU run) and copied back when its backward unpacks it; the
        stage's parameters are not copied (they stay where they are). These hooks are the
        innermost, so the saved-bytes meter counts none of the copies: what the device keeps."""
        if not on:
            return contextlib.nullcontext()
        weights = {t.untyped_storage().data_ptr() for t in [*self.parameters(), *self.buffers()]}
        pinned = any(t.is_cuda for t in flatten(x))

        def pack(t: torch.Tensor) -> Any:
            if t.untyped_storage().data_ptr() in weights:
                return t
            host = torch.empty(t.size(), dtype=t.dtype, layout=t.layout, pin_memory=pinned)
            host.copy_(t)
            return (t.device, host)

        def unpack(packed: Any) -> torch.Tensor:
            if isinstance(packed, torch.Tensor):
                return packed
            device, host = packed
            return host.to(device, non_blocking=pinned)

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    def _run_layer(self, idx: int, x: Any) -> Any:
        return self.layers[idx](x)

    def forward(self, *args: Any) -> Any:
        x: Any = args[0] if len(args) == 1 else tuple(args)
        if not self.metering:
            return _contiguous(self._layers(x))
        with self.measured(args) as box:
            box.append(_contiguous(self._layers(x)))
        return box[0]

    def _layers(self, x: Any) -> Any:
        self._consumed = {}
        ledger = self.ledger if torch.is_grad_enabled() else None
        last = max((i for i, on in enumerate(self.recompute) if on), default=-1)
        for idx in range(len(self.layers)):
            if idx:
                self._consumed.update((id(t), weakref.ref(t)) for t in flatten(x))
            with self._offloading(self.offload[idx] and torch.is_grad_enabled(), x):
                if self.recompute[idx] and ledger is not None:
                    x = ledger.run(self.layers[idx], x)
                    if idx == last:  # the stage's I is cut here (planner.runtime.recompute.input_pass_in_two)
                        after = [p for layer in self.layers[idx + 1 :] for p in layer.parameters()]
                        ledger.cut_after(x, after, follows=idx < len(self.layers) - 1)
                elif self.recompute[idx] and torch.is_grad_enabled():
                    x = checkpoint(self._run_layer, idx, x, use_reentrant=False)
                else:
                    x = self._run_layer(idx, x)
        return x

    @contextlib.contextmanager
    def measured(self, inputs: Any, merge: bool = False) -> Iterator[list[Any]]:
        """Meter what runs inside (its result appended to the yielded list) as one forward's
        :class:`ForwardRecord` (``merge``: added to the last one: the last stage's loss)."""
        before, live = self.meter.held(), self.meter.live_bytes
        box: list[Any] = []
        probe = self.probe
        with self.meter.hooks(), probe.window() if probe is not None else contextlib.nullcontext(-1) as window:
            yield box
        received = storage_keys(inputs)
        out_keys = storage_keys(box[0] if box else ()) - received
        new = self.meter.held() - before - received - out_keys
        record = self.records[-1] if merge and self.records else ForwardRecord()
        record.saved_bytes += self.meter.live_bytes - live
        record.new_saved_bytes += self.meter.bytes_of(new)
        record.output_bytes += _storage_bytes(box[0] if box else (), out_keys)
        if window >= 0:
            record.windows.append(window)
        if not (merge and self.records):
            self.records.append(record)

    def read_allocator(self) -> None:
        """Fill in the allocator's bytes of the metered forwards (after the probe's session)."""
        if self.probe is None:
            return
        for record in self.records:
            counts = [self.probe.bytes_of(w) for w in record.windows]
            if counts and all(c is not None for c in counts):
                record.allocated_bytes = sum(c for c in counts if c is not None) - record.output_bytes


def _storage_bytes(value: Any, keys: set[int]) -> int:
    """Bytes of the storages ``keys`` spanned by the tensors of ``value``."""
    spans: dict[int, list[tuple[int, int]]] = {}
    for t in flatten(value):
        span = saved_span(local(t))
        if span is not None and span[0] in keys:
            spans.setdefault(span[0], []).append((span[1], span[2]))
    return sum(union_bytes(v) for v in spans.values())


def _contiguous(value: Any) -> Any:
    """The stage's output with every tensor contiguous (a no-op for contiguous ones): what
    crosses a boundary is sent, and gloo sends only contiguous tensors (a layer may return a
    transposed view; the layer contract accepts it, ``planner.profiling.measured.contract``)."""
    if isinstance(value, torch.Tensor):
        return value.contiguous()
    if isinstance(value, tuple):
        return tuple(_contiguous(v) for v in value)
    return value
