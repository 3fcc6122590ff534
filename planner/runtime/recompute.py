"""A recomputed layer under a split backward (ZB-H1, ZB-H2, ZBV, DualPipe-V), recomputed by the
stage itself: once, in the micro-batch's input-gradient pass ``I``, and kept until its ``W``.

Why not torch's checkpoint there: non-reentrant ``torch.utils.checkpoint`` keeps what it
recomputed for one backward call only. Under a split backward ``I`` is one call
(``stage_backward_input``) and ``W`` one more per parameter group (``stage_backward_weight``),
so the layer's forward re-ran in ``I`` and again once per group in ``W`` (a zoo GPT block 10
times per micro-batch instead of 2), and between the two passes it held only its inputs, where
the plan prices W's inputs held (docs/zero-bubble.md; ``tests/test_zero_bubble.py`` pins torch's
behaviour). Here, as the plan prices it:

- **forward**: the layer runs without autograd (:class:`_Recomputed`, a custom
  ``autograd.Function`` whose node stands for the layer); its record keeps the layer's inputs
  through the ambient saved-tensor hooks (the saved-bytes meter counts them, as it counted
  checkpoint's inputs; not ``save_for_backward``: the split retains the node until W, and an
  input the layer's own graph does not save, a skip it only adds, would be held there) and the
  RNG state;
- **I** (the node's backward in an input-gradient pass): the layer's forward re-runs with
  autograd from those inputs, under the stage's meter, and torch's own split backward
  (``stage_backward_input``) runs on that graph: the input gradients go on, the layer's
  parameter groups are kept (:class:`Recomputation`);
- **W** (``RecomputeLedger.weight``, after the stage's own W): ``stage_backward_weight`` on
  each kept group; the recomputed graph is freed then, so a micro-batch between its I and its
  W holds what the layer holds as a stage's last layer without recomputation (W's inputs);
- **a whole backward** (``B`` of a schedule that runs some whole, the first stage's ``W``):
  the forward re-runs once and one backward computes the input and parameter gradients;
- **the first stage's I**: torch runs none (its ``W`` is one whole backward); the stage
  rebuilds the recomputed graphs there (:meth:`RecomputeLedger.rebuild`), in order, each on the
  previous one's rebuilt output (one storage per boundary, as without recomputation), so its
  ``W`` runs on them without re-running the forward;
- **a stage's I cut in two** where layers or the loss follow its last recomputed layer
  (:func:`input_pass_in_two`): what follows first, so its tail is freed before the recomputed
  graphs are rebuilt (torch's one pass would hold both until it ends).

The layer's parameters are not inputs of the node: their gradients never pass through the
stage's own graph (no parameter group of the stage's split backward sees them). A layer whose
inputs need no gradient (token ids) gets a zero-element anchor that does, so its output
stays in the graph. Plain schedules (no split backward) keep torch's checkpoint.
"""

from __future__ import annotations

import contextlib
import warnings
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight

from planner.profiling.measured.tensors import flatten, tree_map

__all__ = ["Recomputation", "RecomputeLedger", "input_pass_in_two"]


class Recomputation:
    """One recomputed layer's forward of one micro-batch: its inputs, and from its ``I`` until
    its ``W`` the recomputed graph and its parameter groups."""

    def __init__(self, ledger: RecomputeLedger, layer: nn.Module, value: Any) -> None:
        self.ledger = ledger
        self.layer = layer
        self.value = value  # the layer's input as it came (a tensor or a tuple), until the node keeps it
        self.rng = _rng_state(flatten(value))
        #: the node's inputs as the ambient saved-tensor hooks packed them (:meth:`keep`), until rebuilt
        self.kept: list[Any] = []
        self.unpack: Callable[[Any], torch.Tensor] | None = None
        self.needs_grad: list[bool] = []
        #: per kept input: the earlier recomputed layer of the micro-batch whose node made it, and
        #: which of that node's outputs it is (a chain rebuilt in order shares the rebuilt tensor)
        self.sources: list[tuple[Recomputation, int] | None] = []
        self.inputs: list[torch.Tensor] = []  # the rebuilt graph's leaves, one per distinct input tensor
        self.order: list[int] = []
        self.positions: list[int] = []  # which of the layer's output tensors the node stands for
        self.outputs: list[torch.Tensor] | None = None  # the rebuilt graph's outputs
        self.groups: list[dict[str, Any]] | None = None  # its parameter groups between I and W

    def rebuild(self, metered: bool = True) -> None:
        """Re-run the layer's forward with autograd from its kept inputs (once); ``metered``: under
        the stage's saved-bytes meter (what it rebuilds is held past the pass, to W)."""
        if self.outputs is not None:
            return
        unpack = self.unpack or (lambda t: t)
        # the node's inputs as kept (the skeleton holds their indices); one an earlier layer made,
        # rebuilt already (the first stage rebuilds its chain in order), is that layer's rebuilt
        # output: one storage for both graphs, as without recomputation, not two equal ones
        given = [_rebuilt(source, unpack, k) for k, source in zip(self.kept, self._sources(), strict=True)]
        self.kept, self.unpack = [], None  # the rebuilt graph saves what it needs of them (metered here)
        leaves = [t.detach().requires_grad_(g) for t, g in zip(given, self.needs_grad, strict=True)]
        del given
        self.inputs = leaves
        value = tree_map(lambda t: leaves[int(t.item())], self.value)
        self.order = [int(t.item()) for t in flatten(self.value)]  # each input tensor's leaf
        self.value = None
        self.ledger.forward_runs += 1
        hooks = self.ledger.hooks() if metered else contextlib.nullcontext()
        with torch.enable_grad(), hooks, _restored_rng(self.rng):
            flat = flatten(self.layer(value))
            self.outputs = [flat[k] for k in self.positions]  # the node's outputs, rebuilt

    def backward(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
        """The gradients of the layer's input tensors, in order (a tensor passed twice: once). In
        a whole backward the recomputation is a workspace freed within it, as under torch's
        checkpoint, not metered (the plan prices it apart: ``recompute_workspace_bytes``)."""
        self.rebuild(metered=self.ledger.splitting)
        order = self.order
        per_leaf = self._leaf_grads(grads)
        return [per_leaf[k] if order.index(k) == i else None for i, k in enumerate(order)]

    def _leaf_grads(self, grads: tuple[torch.Tensor | None, ...]) -> list[torch.Tensor | None]:
        """Per leaf: in an input-gradient pass, torch's split backward (the parameter groups kept
        for W); otherwise the whole backward at once."""
        assert self.outputs is not None
        pairs = [(y, g) for y, g in zip(self.outputs, grads, strict=True) if g is not None and y.requires_grad]
        outputs, out_grads = [y for y, _ in pairs], [g for _, g in pairs]
        if self.ledger.splitting and any(t.requires_grad for t in self.inputs):
            with torch.enable_grad():  # torch's split reads the leaves' grad accumulators through views
                dinputs, self.groups = stage_backward_input(outputs, out_grads, self.inputs, iter(self._params()))
            # the gradients go on as the node's; what W needs is in the groups (the outputs were
            # detached by stage_backward_input): the inputs are held from here only where the
            # layer's own graph saved them, as without recomputation (a skip it only adds is freed)
            self.inputs, self.outputs = [], []
            return list(dinputs)
        if outputs:
            torch.autograd.backward(outputs, out_grads)
        grads_in = [t.grad if t.requires_grad else None for t in self.inputs]
        self.release()
        return grads_in

    def weight(self) -> None:
        """The layer's weight gradients from the groups its ``I`` kept; frees the graph."""
        if self.groups is not None:
            stage_backward_weight(iter(self._params()), self.groups)
        self.release()

    def _sources(self) -> list[tuple[Recomputation, int] | None]:
        return self.sources or [None] * len(self.kept)

    def keep(self, tensors: list[torch.Tensor]) -> None:
        """Keep the node's distinct input tensors through the ambient saved-tensor hooks (the
        stage's saved-bytes meter counts them, an offloading layer's copies them to the host), as
        ``save_for_backward`` would, but held by the record, so that an input-gradient pass can
        let them go (:meth:`rebuild`) though the stage's graph is retained until W; the layer's
        input becomes a skeleton of their indices."""
        distinct = list({id(t): t for t in tensors}.values())
        index = {id(t): k for k, t in enumerate(distinct)}
        hooks = torch._C._autograd._top_saved_tensors_default_hooks(False)
        pack, self.unpack = hooks if hooks is not None else (None, None)
        self.kept = [pack(t) if pack is not None else t for t in distinct]
        self.needs_grad = [t.requires_grad for t in distinct]
        self.sources = [self.ledger.made_by(t) for t in distinct]
        self.value = tree_map(lambda t: torch.tensor(index[id(t)]), self.value)

    def release(self) -> None:
        self.value, self.inputs, self.outputs, self.groups, self.kept, self.unpack = None, [], [], None, [], None
        self.sources = []

    def _params(self) -> list[nn.Parameter]:
        return [p for p in self.layer.parameters() if p.requires_grad]


class _Recomputed(torch.autograd.Function):
    """The node standing for a recomputed layer in the stage's graph (module docstring)."""

    @staticmethod
    def forward(ctx: Any, record: Recomputation, out: Callable[[], Any], *tensors: torch.Tensor) -> Any:
        ctx.record = record
        ctx.set_materialize_grads(False)
        flat = out()
        record.keep(flatten(record.value))  # the meter counts the kept inputs here (the anchor: none)
        ctx.mark_non_differentiable(*(t for t in flat if not t.is_floating_point()))
        return tuple(flat)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor | None) -> Any:
        record: Recomputation = ctx.record
        dinputs = record.backward(grads)
        anchor = len(ctx.needs_input_grad) - 2 - len(dinputs)  # 1 where the anchor was added
        return (None, None, *dinputs, *([None] * anchor))


class RecomputeLedger:
    """A stage's recomputed layers under a split backward: per micro-batch (the chunk the
    pipeline runs), its :class:`Recomputation` s, from the forward to the ``W`` (or the whole
    backward); which pass runs now (``splitting``: an input-gradient pass)."""

    def __init__(self, hooks: Callable[[], contextlib.AbstractContextManager[Any]]) -> None:
        self.hooks = hooks  # the stage's saved-bytes meter around a recomputation (or nothing)
        self.chunk: int | None = None  # the micro-batch whose forward runs now
        self.splitting = False
        self.records: dict[int, list[Recomputation]] = {}
        #: per micro-batch: the outputs of the stage's last recomputed layer and the parameters of
        #: the layers after it, where something follows it (:func:`input_pass_in_two`)
        self.cuts: dict[int, tuple[list[torch.Tensor], list[nn.Parameter]]] = {}
        self.last_made: list[torch.Tensor] = []  # the outputs of the last node :meth:`run` made
        #: the running forward's node outputs: by id, the tensor (weakly), its node's record, which output
        self._made: dict[int, tuple[weakref.ref[torch.Tensor], Recomputation, int]] = {}
        self.loss_follows = False  # the stage is the pipeline's last (set by its executor)
        self.forward_runs = 0  # recomputations run (the tests count them)

    def run(self, layer: nn.Module, value: Any) -> Any:
        """The layer's output for ``value``, computed without autograd and recomputed later. A
        tensor it hands on unchanged (a skip in a tuple) stays the input itself, outside the node."""
        record = Recomputation(self, layer, value)
        if self.chunk is not None:
            self.records.setdefault(self.chunk, []).append(record)
        tensors = flatten(value)
        given = {id(t) for t in tensors}
        result: list[Any] = []

        def out() -> list[torch.Tensor]:
            result.append(layer(value))
            flat = flatten(result[0])
            record.positions = [k for k, t in enumerate(flat) if id(t) not in given]
            return [flat[k] for k in record.positions]

        if not any(t.requires_grad for t in tensors):  # keep the output in the graph
            tensors = [*tensors, torch.empty(0, device=_device(tensors), requires_grad=True)]
        made = list(_Recomputed.apply(record, out, *tensors))
        self.last_made = made
        if self.chunk is not None:
            self._made.update((id(t), (weakref.ref(t), record, m)) for m, t in enumerate(made))
        fresh = iter(made)
        return tree_map(lambda t: t if id(t) in given else next(fresh), result[0])

    def cut_after(self, output: Any, after: list[nn.Parameter], follows: bool) -> None:
        """Mark ``output``, the stage's last recomputed layer's (``follows``: layers of the stage
        after it), as where the micro-batch's input-gradient pass is cut in two
        (:func:`input_pass_in_two`), where that layer's node made every tensor of it."""
        flat, made = flatten(output), self.last_made
        self.last_made = []  # held no longer than the micro-batch's backward
        if not (follows or self.loss_follows):
            return  # nothing after it: torch's one pass holds no tail (and a sent output stays freeable)
        if self.chunk is not None and flat and all(any(t is m for m in made) for t in flat):
            self.cuts[self.chunk] = (flat, after)

    def made_by(self, tensor: torch.Tensor) -> tuple[Recomputation, int] | None:
        """The record of the running forward's recomputed layer whose node made ``tensor``, and
        which of its outputs it is (None: not a recomputed layer's output)."""
        found = self._made.get(id(tensor))
        return (found[1], found[2]) if found is not None and found[0]() is tensor else None

    @contextlib.contextmanager
    def forward_of(self, chunk: int) -> Iterator[None]:
        self.chunk = chunk
        try:
            yield
        finally:
            self.chunk = None
            self._made = {}

    @contextlib.contextmanager
    def backward_of(self, splitting: bool) -> Iterator[None]:
        self.splitting = splitting
        try:
            yield
        finally:
            self.splitting = False

    def rebuild(self, chunk: int) -> None:
        """The first stage's ``I`` (torch runs none there): rebuild the micro-batch's recomputed graphs."""
        for record in self.records.get(chunk, ()):
            record.rebuild()

    def weight(self, chunk: int) -> None:
        """The micro-batch's ``W`` of its recomputed layers (after the stage's own)."""
        self.cuts.pop(chunk, None)
        for record in self.records.pop(chunk, ()):
            record.weight()

    def release(self, chunk: int) -> None:
        """After a whole backward: the micro-batch's recomputations are done."""
        self.cuts.pop(chunk, None)
        for record in self.records.pop(chunk, ()):
            record.release()


def input_pass_in_two(
    cut: tuple[list[torch.Tensor], list[nn.Parameter]], stage_output: Any, output_grads: Any, input_values: Any,
    params: list[nn.Parameter],
) -> tuple[tuple[torch.Tensor | None, ...], list[dict[str, Any]]]:
    """A stage's input-gradient pass cut after its last recomputed layer (what torch's
    ``stage_backward_input`` returns: the input gradients and the parameter groups for W). The
    layers after it (and the loss) first, to the cut: torch's split frees their tail (what
    follows their last weight GEMM, the loss's logits) as it ends; then the rest, where the
    recomputed layers' graphs are rebuilt and kept. Torch's one pass over the stage would hold
    that tail until the whole pass ends, over the recomputed layers' W inputs: above what the
    plan prices for a micro-batch in its I (docs/zero-bubble.md)."""
    cut_at, after = cut
    mine = {id(p) for p in after}
    before = [p for p in params if id(p) not in mine]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # the cut's tensors are not leaves: their .grad is set and read
        grads_cut, groups = stage_backward_input(list(stage_output), output_grads, cut_at, iter(after))
        for t in cut_at:
            t.grad = None
    pairs = [(t, g) for t, g in zip(cut_at, grads_cut, strict=True) if g is not None]
    if not pairs:
        return tuple(None for _ in input_values), groups
    # torch's pass detaches its outputs in place; the cut's tensors are saved by the layers after
    # it (for W), so the second pass starts from aliases of them (sharing their storage)
    aliases = [_Alias.apply(t) for t, _ in pairs]
    dinputs, rest = stage_backward_input(aliases, [g for _, g in pairs], input_values, iter(before))
    return dinputs, groups + rest


class _Alias(torch.autograd.Function):
    """The identity, its output a new tensor on the input's storage (not a view)."""

    @staticmethod
    def forward(ctx: Any, t: torch.Tensor) -> torch.Tensor:
        return t.detach()

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        return grad


def _rebuilt(source: tuple[Recomputation, int] | None, unpack: Callable[[Any], torch.Tensor], kept: Any) -> torch.Tensor:
    """A kept input: the earlier layer's rebuilt output ``source`` names where that layer is
    rebuilt and not yet split, else the input as kept."""
    if source is None or not source[0].outputs:
        return unpack(kept)
    return source[0].outputs[source[1]]


def _device(tensors: list[torch.Tensor]) -> torch.device:
    return tensors[0].device if tensors else torch.device("cpu")


def _rng_state(tensors: list[torch.Tensor]) -> tuple[torch.Tensor, list[torch.device], list[torch.Tensor]]:
    """The CPU RNG state and that of the inputs' CUDA devices (as torch's checkpoint keeps them)."""
    devices = sorted({t.device for t in tensors if t.is_cuda}, key=str)
    return torch.get_rng_state(), devices, [torch.cuda.get_rng_state(d) for d in devices]


@contextlib.contextmanager
def _restored_rng(state: tuple[torch.Tensor, list[torch.device], list[torch.Tensor]]) -> Iterator[None]:
    cpu, devices, cuda = state
    with torch.random.fork_rng(devices=devices):
        torch.set_rng_state(cpu)
        for device, s in zip(devices, cuda, strict=True):
            torch.cuda.set_rng_state(s, device)
        yield
