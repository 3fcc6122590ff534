"""Hugging Face ``transformers`` models from their configs: ``hf:CONFIG[:key=value,...]``.

``CONFIG`` is a ``config.json``, a directory holding one, or a ``model_type`` known to
transformers (an inline spec: ``hf:llama:layers=2,hidden=64,heads=4,kv_heads=2``). The model
is built with ``AutoModelFor*.from_config`` under a seeded RNG (random weights; nothing is
downloaded, the JSON is read here and handed to ``AutoConfig.for_model``) and cut into the
planner's layers over its block list, found by architecture (:data:`FAMILIES`):

- ``llama``, ``mistral``, ``qwen2``: causal LM (``AutoModelForCausalLM``); embedding
  ``model.embed_tokens``, blocks ``model.layers``, final norm ``model.norm``, head ``lm_head``,
  rotary ``model.rotary_emb``;
- ``gpt2``: causal LM; embedding ``transformer.wte`` + ``transformer.wpe``, blocks
  ``transformer.h``, final norm ``transformer.ln_f``, head ``lm_head`` (tied to ``wte``);
- ``bert``: masked LM (``AutoModelForMaskedLM``); embedding ``bert.embeddings``, blocks
  ``bert.encoder.layer``, no final norm (post-norm blocks), head ``cls`` (decoder tied to the
  word embeddings).
- ``t5``: sequence-to-sequence LM (``AutoModelForSeq2SeqLM``): ``encoder.block`` and
  ``decoder.block`` with their final norms, shared token embedding, ``lm_head`` (layers below).

Layers ``embed``, ``block_0`` .. ``block_{L-1}``, ``norm`` (when the model has a final norm),
``head`` (:mod:`planner.models.hf_layers`; the attention: :mod:`planner.models.hf_attention`).
What each layer does that the whole model's ``forward`` would have done:

- inputs are ``(input_ids, attention_mask)`` (int64, ``b x s``; 1 = token, 0 = padding, right
  padded, so position ids are ``0 .. s-1`` for every real token); the padding mask travels
  with the hidden states through the blocks (int64, 8 bytes a token, no gradient) and each
  block builds its 4-D mask with transformers' own ``create_causal_mask`` /
  ``create_sliding_window_causal_mask`` (per ``layer_types`` for qwen2) /
  ``create_bidirectional_mask`` for the model's attention implementation (``sdpa``);
- rotary position embeddings (llama family): every block holds the model's ``rotary_emb``
  (buffers only, shared, not in the state dict) and computes ``(cos, sin)`` for positions
  ``0 .. s-1`` itself, so no float tensor without a gradient crosses a stage boundary;
- grouped-query attention (``num_key_value_heads`` < heads) is the model's own attention;
- blocks that return a ``ModelOutput`` or a tuple hand on their first element (hidden states);
- tied input/output embeddings (``tie_word_embeddings``, BERT's decoder): the parameters that
  are one object in the built model are found by identity and listed in ``Workload.tied``;
- dropout probabilities are set to 0 (deterministic runs); the model stays in train mode;
- attention runs through ``planner_sdpa``, transformers' own SDPA attention function (and
  mask) registered under the planner's name, which calls it through
  :func:`planner.models.selective.run_core`: every attention module (the innermost module of a
  block whose class name ends in ``Attention``) owns an attention core that selective
  recomputation can re-run in backward;
- ``seq`` (tokens per sample) defaults to 128, or the model's ``max_position_embeddings`` when
  smaller; a model whose float32 weights would take more than half the machine's memory is
  refused before it is built (counted on the meta device) with a pointer to the analytic
  profile (``planner profile --analytic hf --config ...``).

Targets are token labels with ``-100`` where no loss is taken (padding; for the masked LM
every position but the ~15% masked ones, at least one a sample, whose input id becomes
``vocab - 1`` as ``[MASK]``). The loss is HF's: the mean cross entropy over the labelled
tokens, returned as ``(sum, count)`` (the Workload contract's token-weighted form), so a step
split into micro-batches with different numbers of real tokens has the loss of the whole batch.

The model fingerprint (``Workload.model_config``, :func:`model_config`) holds, beside the layer
names and parameter shapes, every config field that differs from the model type's defaults
(bookkeeping such as ``transformers_version`` and the dtype left out): a field that changes no
shape (``sliding_window``, ``rope_parameters``) still changes what the blocks compute, so a plan
made at one value is refused at another, naming the field.

Tensor parallelism (:func:`tensor_parallel`): the llama family's blocks split by their config's
``base_model_tp_plan``, GPT-2's and BERT's by their recognised standard blocks
(:mod:`planner.models.tp_plans`); with sequence parallelism a block receives its device's slice of
the hidden states and the whole padding mask, so it builds the mask and the rotary positions of
the whole sequence (the attention all-gathers the tokens).

Encoder-decoder: ``t5`` (``AutoModelForSeq2SeqLM``) is cut by :mod:`planner.models.hf_t5`
into encoder and decoder layers, the encoder output carried through every decoder stage (its
cross-attention reads it) and each stack's relative position bias recomputed per block from
the stack's shared (tied) bias embedding. Other encoder-decoders (BART, ...) are refused,
saying why.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from planner.artifacts.errors import PlannerInputError
from planner.models.common import parse_dtype, seeded
from planner.models.hf_attention import ATTENTION, mark_attention_cores, register_attention
from planner.models.hf_layers import Block, Embed, Head, Norm, batch_maker, token_loss
from planner.models.hf_spec import HFSpec, check_config, load_config_dict, parse_spec
from planner.models.hf_t5 import t5_batch_maker, t5_layers
from planner.models.workload import ContextParallel, TensorParallel, Workload

__all__ = ["ATTENTION", "FAMILIES", "HFSpec", "build", "load_config_dict", "mark_attention_cores", "parse_spec",
           "register_attention"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Family:
    """Where an architecture keeps its pieces, and which task head it is trained with."""

    task: str  # "causal-lm" | "masked-lm"
    auto_class: str
    embed: str
    blocks: str
    norm: str  # "" = no final norm
    head: str
    rotary: str = ""


LLAMA = Family(task="causal-lm", auto_class="AutoModelForCausalLM", embed="model.embed_tokens",
               blocks="model.layers", norm="model.norm", head="lm_head", rotary="model.rotary_emb")
FAMILIES: dict[str, Family] = {
    "llama": LLAMA,
    "mistral": LLAMA,
    "qwen2": LLAMA,
    "gpt2": Family(task="causal-lm", auto_class="AutoModelForCausalLM", embed="transformer.wte",
                   blocks="transformer.h", norm="transformer.ln_f", head="lm_head"),
    "bert": Family(task="masked-lm", auto_class="AutoModelForMaskedLM", embed="bert.embeddings",
                   blocks="bert.encoder.layer", norm="", head="cls"),
    "t5": Family(task="seq2seq-lm", auto_class="AutoModelForSeq2SeqLM", embed="encoder.embed_tokens",
                 blocks="encoder.block", norm="encoder.final_layer_norm", head="lm_head"),  # planner.models.hf_t5
}


def _transformers() -> Any:
    try:
        import transformers
    except ImportError:
        raise PlannerInputError("hf: models need transformers (pip install 'planner[hf]')") from None
    return transformers


def make_config(spec: HFSpec, where: str) -> Any:
    """The transformers config: the spec's fields over the model type's defaults, dropout 0,
    SDPA attention. Unknown fields, encoder-decoders and unsupported types are refused."""
    check_config(spec.config, where)  # parse_spec did, before transformers was imported; a spec built by hand too
    transformers = _transformers()
    fields = dict(spec.config)
    model_type = fields.pop("model_type")
    defaults = transformers.CONFIG_MAPPING[model_type]()
    # bookkeeping fields of a published config.json, and "_"-prefixed notes such as "_source"
    ignored = {"architectures", "transformers_version", "torch_dtype", "dtype", "auto_map", "use_cache"}
    ignored |= {k for k in fields if k.startswith("_")}
    legacy = {"rope_theta", "rope_scaling"}  # transformers 5 folds them into rope_parameters
    unknown = sorted(k for k in fields if k not in ignored | legacy and not hasattr(defaults, k))
    if unknown:
        raise PlannerInputError(f"{where}: {model_type} config has no field {unknown[0]!r}")
    for key in ignored:
        fields.pop(key, None)
    if model_type == "t5" and "num_hidden_layers" in fields:  # layers= sets both stacks
        fields["num_layers"] = fields.pop("num_hidden_layers")
        fields.setdefault("num_decoder_layers", fields["num_layers"])
    vocab = fields.get("vocab_size", defaults.vocab_size)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):  # GPT-2's 50256 in a small vocabulary
        if isinstance(fields.get(key, getattr(defaults, key, None)), int) and fields.get(key, getattr(defaults, key)) >= vocab:
            fields[key] = None
    config = transformers.AutoConfig.for_model(model_type, **fields)
    for key in list(vars(config)):
        if ("dropout" in key or "pdrop" in key) and isinstance(getattr(config, key), float):
            setattr(config, key, 0.0)
    register_attention()
    config._attn_implementation = ATTENTION
    return config


#: config fields that change nothing the blocks compute (bookkeeping, or what the run sets itself)
_NOT_FINGERPRINTED = frozenset({"transformers_version", "architectures", "torch_dtype", "dtype", "use_cache",
                                "_name_or_path", "auto_map"})


def model_config(config: Any) -> dict[str, str]:
    """The config fields that differ from the model type's defaults, as JSON text (what the model
    fingerprint holds beside the shapes; see the module docstring)."""
    import json

    defaults = _transformers().CONFIG_MAPPING[config.model_type]().to_dict()
    out = {}
    for key, value in sorted(config.to_dict().items()):
        if key in _NOT_FINGERPRINTED or key.startswith("_") or defaults.get(key, object()) == value:
            continue
        out[key] = json.dumps(value, sort_keys=True, default=str)
    return out


def _get(model: nn.Module, path: str) -> Any:
    return model.get_submodule(path)


def _tied_groups(layers: tuple[nn.Module, ...]) -> tuple[tuple[tuple[int, str], ...], ...]:
    owners: dict[int, list[tuple[int, str]]] = {}
    for idx, layer in enumerate(layers):
        for name, param in layer.named_parameters():
            owners.setdefault(id(param), []).append((idx, name))
    return tuple(tuple(g) for g in owners.values() if len({i for i, _ in g}) > 1)


def _check_size(auto: Any, config: Any, where: str) -> int:
    """Parameters of the model, counted on the meta device; refuse what would not fit in half
    the machine's memory in float32 (use the analytic profile for those)."""
    with torch.device("meta"):
        count = sum(p.numel() for p in auto.from_config(config).parameters())
    try:
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        memory = 64 << 30
    if 4 * count > memory // 2:
        raise PlannerInputError(
            f"{where}: {count:,} parameters do not fit this machine in float32 ({4 * count / 2**30:.1f} GiB);"
            " plan it from an analytic profile (planner profile --analytic hf --config ...) or shrink it with"
            " layers=/hidden= options"
        )
    return count


def build(spec: HFSpec, where: str) -> Workload:
    """The workload of an ``hf:`` spec (see the module docstring)."""
    transformers = _transformers()
    config = make_config(spec, where)
    model_type = config.model_type
    family = FAMILIES[model_type]
    max_positions = getattr(config, "max_position_embeddings", None) or getattr(config, "n_positions", None)
    seq = spec.seq or min(int(max_positions or 128), 128)
    if max_positions is not None and seq > max_positions:
        raise PlannerInputError(f"{where}: seq={seq} exceeds the model's max_position_embeddings ({max_positions})")
    auto = getattr(transformers, family.auto_class)
    _check_size(auto, config, where)
    try:
        with seeded(spec.seed):
            model = auto.from_config(config)
    except (ValueError, TypeError, RuntimeError, AssertionError) as exc:
        raise PlannerInputError(f"{where}: transformers cannot build it: {' '.join(str(exc).split())}") from None
    model = model.to(parse_dtype(spec.dtype))
    model.train()
    mark_attention_cores(model)
    blocks = _get(model, family.blocks)
    vocab = int(config.vocab_size)
    pad_id = getattr(config, "pad_token_id", None) or 0
    if model_type == "t5":
        layers, names = t5_layers(model, config)
        start_id = getattr(config, "decoder_start_token_id", None)
        make_batch = t5_batch_maker(vocab, seq, spec.padding, pad_id, pad_id if start_id is None else start_id)
    else:
        layers, names = _single_stack(model, model_type, family, config, blocks)
        make_batch = batch_maker(family.task, vocab, seq, spec.padding, pad_id)
    options = {
        "model_type": model_type,
        "task": family.task,
        "source": spec.source,
        "layers": len(blocks),
        "hidden": int(config.hidden_size),
        "heads": int(config.num_attention_heads),
        "kv_heads": int(getattr(config, "num_key_value_heads", None) or config.num_attention_heads),
        "vocab": vocab,
        "seq": seq,
        "seed": spec.seed,
        "dtype": spec.dtype,
        "padding": int(spec.padding),
        "tie_word_embeddings": bool(getattr(config, "tie_word_embeddings", False)),
        "blocks_path": family.blocks,
    }
    if model_type == "t5":
        options["decoder_layers"] = len(_get(model, "decoder.block"))
    built = tuple(layers)
    return Workload(
        name=f"hf-{model_type}",
        layers=built,
        layer_names=tuple(names),
        make_batch=make_batch,
        loss_fn=token_loss,
        tied=_tied_groups(built),
        options=options,
        tensor_parallel=tensor_parallel(model_type, config, seq),
        # the llama family's blocks take their shard of the tokens; the padding mask travels whole
        context_parallel=ContextParallel(sequence_length=seq, whole_inputs=(1,)) if family is LLAMA else None,
        model_config=model_config(config),
    )


def tensor_parallel(model_type: str, config: Any, seq: int) -> TensorParallel | None:
    """How the blocks split over tensor-parallel devices: the llama family by its config's
    ``base_model_tp_plan`` (its ``layers.*.`` entries, ``colwise`` / ``rowwise``, on each block),
    GPT-2 and BERT by their standard blocks (:meth:`TensorParallel.recognised`: GPT-2's fused
    ``c_attn`` split within q, k and v); t must divide the heads (and the key/value heads). The
    embedding, final norm and head stay whole; T5 (its attention reshapes by a fixed head count)
    does not split."""
    heads = int(config.num_attention_heads)
    kv = int(getattr(config, "num_key_value_heads", None) or heads)
    divide = (heads, kv) if kv != heads else (heads,)
    if model_type in ("gpt2", "bert"):
        return TensorParallel.recognised(must_divide=divide, sequence_length=seq)
    if model_type not in ("llama", "mistral", "qwen2"):
        return None
    plan = {f"block.{key.removeprefix('layers.*.')}": kind for key, kind in (getattr(config, "base_model_tp_plan", None) or {}).items()
            if key.startswith("layers.*.") and kind in ("colwise", "rowwise")}
    if not plan:
        return TensorParallel.recognised(must_divide=divide, sequence_length=seq)
    return TensorParallel.from_plan(plan, must_divide=divide, sequence_length=seq)


def _single_stack(model: nn.Module, model_type: str, family: Family, config: Any, blocks: Any) -> tuple[list[nn.Module], list[str]]:
    rotary = _get(model, family.rotary) if family.rotary else None
    positions = _get(model, "transformer.wpe") if model_type == "gpt2" else None
    layers: list[nn.Module] = [Embed(model_type, _get(model, family.embed), positions)]
    layers += [Block(model_type, b, i, config, rotary) for i, b in enumerate(blocks)]
    names = ["embed", *(f"block_{i}" for i in range(len(blocks)))]
    if family.norm:
        layers.append(Norm(_get(model, family.norm)))
        names.append("norm")
    layers.append(Head(_get(model, family.head), takes_tuple=not family.norm))
    names.append("head")
    return layers, names
