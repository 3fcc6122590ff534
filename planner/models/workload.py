"""The Workload contract: what a model factory hands to the profiler and the runtime.

A workload is a model presented as an ordered list of *layers* (the units a stage boundary
may fall between) plus what is needed to train it: a seeded batch generator and a loss.

Contract (checked by the profiler and the runtime):

- ``layers[0]`` takes the batch inputs; ``layers[i]`` takes the output of ``layers[i - 1]``
  (a tensor, or a flat tuple of tensors when several tensors cross the boundary, e.g. a skip
  connection that spans layers); the model's output is the output of ``layers[-1]``.
  ``planner profile`` refuses, naming the layer and the tensor, a layer output that is a dict
  (a ``transformers`` ``ModelOutput`` is one), a list, ``None``, a nested tuple, or a tensor
  of a dtype gloo and NCCL cannot send (complex, quantized). Accepted and documented: a
  non-contiguous tensor (the runtime sends a contiguous copy, made at the end of each stage),
  and a floating tensor that does not require grad (every floating boundary tensor is treated
  as an activation and sent a gradient back, zeros if nothing depends on it: pass masks and
  ids as bool or integer tensors, which carry none). ``planner.profiling.measured.contract`` has it all.
- ``make_batch(batch_size, seed)`` returns ``(inputs, targets)`` deterministically for a seed;
  samples are independent, so a batch split into micro-batches along dim 0 gives the same
  samples.
- ``loss_fn(outputs, targets)`` returns either the *mean* loss over the samples of the batch
  (a scalar tensor: every micro-batch then weighs the same, and the mean over M equal
  micro-batches equals the loss of the whole batch), or a pair ``(sum, count)``: the summed
  loss of the batch's units (e.g. tokens that are not padding) and how many units there are
  (a number or a scalar tensor; no gradient flows through it). With a pair, the training
  loss of a step is the sum over all its micro-batches / the count over all of them, exactly
  the one-process loss of a token-weighted objective (padded or masked language modelling),
  whatever the units per micro-batch.
- ``tied`` lists groups of parameters that are one tensor in the model, as
  ``(layer_idx, parameter name within that layer)``, e.g. ``((0, "weight"), (5, "weight"))``
  for an input embedding shared with the output head. When the layers of a group land on
  different stages the runtime keeps one copy per stage and sums their gradients.

This module does not import torch; the types are torch's at run time.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TiedGroup = tuple[tuple[int, str], ...]


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorParallel:
    """How a workload's layers split over tensor-parallel devices (Megatron-LM): a function
    giving each layer's ``parallelize_module`` plan, or, simpler, :meth:`from_plan` (declared per
    module) or :meth:`recognised` (standard attention and MLP blocks found by name)."""

    styles: Callable[[Any, bool], dict[str, Any] | None] = field(
        metadata={
            "doc": "(layer module, sequence_parallel) -> parallelize_module plan, or None (layer stays whole); "
                   "with sequence parallelism a split layer takes and returns its device's slice of dim 1"
        }
    )
    must_divide: tuple[int, ...] = field(default=(), metadata={"doc": "sizes t must divide (attention heads)"})
    sequence_length: int = field(
        default=0, metadata={"doc": "tokens per sample, split over t with sequence parallelism (0 = none)"}
    )

    @classmethod
    def from_plan(cls, plan: Mapping[str, str], *, must_divide: tuple[int, ...] = (), sequence_length: int = 0) -> TensorParallel:
        """A split declared per module, in Hugging Face's ``tp_plan`` notation: module paths
        inside each layer (``*`` for one path component) -> ``"colwise"`` (output features split:
        q, k, v, an MLP's first projection), ``"colwise_qkv"`` (a fused q/k/v projection, split
        within each part) or ``"rowwise"`` (input features split, the partial outputs all-reduced:
        the attention's output projection, the MLP's second), e.g.
        ``TensorParallel.from_plan({"attn.q": "colwise", "attn.k": "colwise", "attn.v": "colwise",
        "attn.proj": "rowwise", "mlp.fc1": "colwise", "mlp.fc2": "rowwise"}, must_divide=(heads,))``.
        A layer with no row-split module stays whole. ``planner profile`` checks each split layer
        computes the layer (:func:`planner.models.tp_check.check_split`)."""
        from planner.models.tp_plans import plan_styles  # torch: only when a split is declared

        return cls(styles=plan_styles(plan), must_divide=must_divide, sequence_length=sequence_length)

    @classmethod
    def recognised(cls, *, must_divide: tuple[int, ...] = (), sequence_length: int = 0) -> TensorParallel:
        """The standard blocks of each layer split where they are recognised by the names of
        their projections (attention: ``q_proj/k_proj/v_proj`` + ``o_proj`` or ``out_proj``,
        ``q/k/v`` + ``proj`` or ``o``, BERT's ``query/key/value`` + ``output.dense``, GPT-2's fused
        ``c_attn`` + ``c_proj``; MLPs: ``gate_proj/up_proj`` + ``down_proj``, ``w1/w3`` + ``w2``,
        ``fc1`` + ``fc2``, ``c_fc`` + ``c_proj``, ``fc`` + ``out``, BERT's ``intermediate.dense`` +
        ``output.dense``; :mod:`planner.models.tp_plans`). ``planner profile`` computes every such
        layer split over two emulated devices and refuses one whose output differs (e.g. an
        attention that reshapes by a fixed head count), naming it."""
        from planner.models.tp_plans import recognised_plan, styles_for

        def styles(layer: Any, sequence_parallel: bool) -> dict[str, Any] | None:
            return styles_for(layer, recognised_plan(layer), sequence_parallel)

        return cls(styles=styles, must_divide=must_divide, sequence_length=sequence_length)

    def refusal(self, t: int, sequence_parallel: bool) -> str:
        """Why this model cannot split over ``t`` devices ("" when it can)."""
        for size in self.must_divide:
            if size % t:
                return f"tensor-parallel degree {t} does not divide the model's {size} attention heads"
        if sequence_parallel and self.sequence_length % t:
            return f"sequence parallelism over {t} devices does not divide the {self.sequence_length} tokens per sample"
        return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ContextParallel:
    """How a workload's samples split along the sequence over context-parallel ranks (Llama 3's
    context parallelism, ``planner.models.context``): every input tensor and the targets are cut
    along dim 1 into 2 cp chunks, rank i keeping chunks i and 2 cp - 1 - i, except the inputs
    listed in ``whole_inputs`` (a tuple input's positions, e.g. a padding mask the attention
    reads for every key), which every rank receives whole. The model's layers take their shard
    from ``planner.models.context.context_of`` (positions, the K/V all-gather, the mask)."""

    sequence_length: int = field(metadata={"doc": "tokens per sample, cut into 2 cp chunks"})
    whole_inputs: tuple[int, ...] = field(default=(), metadata={"doc": "positions of a tuple input passed whole"})

    def refusal(self, cp: int) -> str:
        """Why this model cannot split its sequence over ``cp`` ranks ("" when it can)."""
        if self.sequence_length % (2 * cp):
            return (f"context parallelism over {cp} ranks cuts each sequence into {2 * cp} chunks: "
                    f"the model's {self.sequence_length} tokens per sample do not divide")
        return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A model as an ordered list of layers, with a seeded batch generator and a loss.

    Fields (the module docstring states the contract each must keep):

    - ``name``: the model's name, recorded in profiles, plans and run reports.
    - ``layers``: one ``torch.nn.Module`` per layer, in order; a stage boundary may fall
      between any two. ``layers[i]`` is called with the output of ``layers[i - 1]`` (a tensor
      or a flat tuple of tensors), ``layers[0]`` with the batch inputs. A tuple reaches the next
      layer as ONE argument, ``layers[i]((a, b))``, not unpacked as ``layers[i](a, b)``: a layer
      that passes several tensors on (a skip connection spanning layers, a mask beside the
      hidden states) returns a tuple and the next layer unpacks it. For skips between blocks,
      :func:`planner.models.chain` (``chain(modules, skips=[(src, dst), ...])``) builds the layers
      with every skip tensor carried through the layers in between (a U-Net in its docstring).
    - ``layer_names``: one unique name per layer (plans and profiles name layers by them; the
      model fingerprint is these names and the parameter shapes).
    - ``make_batch``: ``make_batch(batch_size, seed) -> (inputs, targets)``, deterministic for
      a seed, samples independent along dim 0 (the runtime trains step k on
      ``make_batch(global_batch, seed + k)``).
    - ``loss_fn``: ``loss_fn(outputs, targets)`` -> the mean loss of the batch (a scalar
      tensor), or ``(sum, count)`` for a loss weighted by units such as tokens.
    - ``tied``: groups of ``(layer_idx, parameter name)`` that are one parameter in the model
      (e.g. an embedding tied to the LM head); default none.
    - ``options``: the factory's options (e.g. ``{"layers": 4}``), recorded in the profile's
      metadata; default empty.
    - ``tensor_parallel``: how the layers split over tensor-parallel devices
      (:class:`TensorParallel`), or None when the model does not split; default None.
    - ``context_parallel``: how its samples split along the sequence over context-parallel
      ranks (:class:`ContextParallel`), or None when the model does not run context parallel;
      default None.
    - ``model_config``: settings that change what the model computes but no parameter shape
      (a Hugging Face config's fields that differ from its type's defaults, such as
      ``sliding_window``), field -> its value as JSON text; hashed into the model fingerprint
      with the layer names and parameter shapes, so a plan made for one setting is refused for
      another, naming the field; default empty.
    - ``model_flops_per_sample``: FLOPs of one training sample's forward and backward without
      recomputation (the count MFU uses), recorded in the profile; default 0 (unknown: the
      plan then shows no MFU).
    """

    name: str
    layers: tuple[Any, ...] = field(metadata={"doc": "torch.nn.Module per layer, in order"})
    layer_names: tuple[str, ...]
    make_batch: Callable[[int, int], tuple[Any, Any]]
    loss_fn: Callable[[Any, Any], Any]
    tied: tuple[TiedGroup, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    tensor_parallel: TensorParallel | None = None
    model_flops_per_sample: float = 0.0
    context_parallel: ContextParallel | None = None
    model_config: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not (self.model_flops_per_sample >= 0 and self.model_flops_per_sample < float("inf")):
            raise ValueError(f"workload {self.name!r}: model_flops_per_sample must be finite and >= 0 "
                             f"(got {self.model_flops_per_sample!r})")
        if not self.layers:
            raise ValueError(f"workload {self.name!r} has no layers")
        if len(self.layer_names) != len(self.layers):
            raise ValueError(
                f"workload {self.name!r}: {len(self.layer_names)} layer names for {len(self.layers)} layers"
            )
        if len(set(self.layer_names)) != len(self.layer_names):
            raise ValueError(f"workload {self.name!r}: layer names must be unique")
        for group in self.tied:
            for layer_idx, _ in group:
                if not 0 <= layer_idx < len(self.layers):
                    raise ValueError(f"workload {self.name!r}: tied group names layer {layer_idx}")


def split_loss(value: Any) -> tuple[Any, Any | None]:
    """What ``loss_fn`` returned, as ``(loss, None)`` for a mean loss or ``(sum, count)`` for a
    loss weighted by units (see the module docstring)."""
    if isinstance(value, tuple):
        if len(value) != 2:
            raise ValueError(f"loss_fn returned a tuple of {len(value)}; expected a mean loss or (sum, count)")
        return value[0], value[1]
    return value, None
