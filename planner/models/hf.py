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
``head``. What each layer does that the whole model's ``forward`` would have done:

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
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.artifacts.errors import PlannerInputError
from planner.models.common import generator, parse_dtype, seeded
from planner.models.context import SequenceShard, context_of
from planner.models.hf_spec import HFSpec, check_config, load_config_dict, parse_spec
from planner.models.hf_t5 import t5_batch_maker, t5_layers
from planner.models.hf_values import check_activation_names
from planner.models.selective import RECOMPUTE_ATTR, run_core
from planner.models.workload import ContextParallel, TensorParallel, Workload

__all__ = ["ATTENTION", "FAMILIES", "HFSpec", "build", "load_config_dict", "mark_attention_cores", "parse_spec",
           "register_attention"]

MASK_FRACTION = 0.15  # masked-LM positions per sample (Devlin et al. 2019, section 3.1)
IGNORE = -100
ATTENTION = "planner_sdpa"  # transformers' SDPA attention, its core run by planner.models.selective


def _planner_sdpa(module: nn.Module, query: Any, key: Any, value: Any, *args: Any, **kwargs: Any) -> Any:
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    shard = context_of(module)  # context parallelism: every rank's keys and values (the block built the mask)
    if shard is None:
        return run_core(module, sdpa_attention_forward, module, query, key, value, *args, **kwargs)
    with shard.regathering():  # a kept core: its saved K/V re-gathered in backward
        return run_core(module, shard.gathered(_context_sdpa, at=1), module, query, key, value, *args, **kwargs)


def _context_sdpa(module: nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                  attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                  **_: Any) -> tuple[torch.Tensor, None]:
    """The attention core under context parallelism: SDPA of the rank's queries over the gathered
    keys and values under the block's boolean mask (``_context_mask``), as transformers'
    ``sdpa_attention_forward`` computes it with a mask, but with grouped-query attention done by
    the kernel (``enable_gqa``) where transformers copies K and V ``heads`` wide first
    (``repeat_kv``, whenever a mask is given): the kernel then saves the gathered K and V
    themselves, which :meth:`SequenceShard.regathering` re-gathers in backward, not a copy it
    would keep (``planner.models.context``)."""
    groups = int(getattr(module, "num_key_value_groups", 1))
    out = F.scaled_dot_product_attention(query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
                                         enable_gqa=groups > 1)
    return out.transpose(1, 2).contiguous(), None


def register_attention() -> None:
    """``planner_sdpa`` in transformers' attention and mask registries (SDPA's own mask)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, _planner_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


def mark_attention_cores(model: nn.Module) -> None:
    """The attention modules (innermost ``*Attention`` modules) own an attention core."""
    for module in model.modules():
        inner = any(type(c).__name__.endswith("Attention") for c in module.modules() if c is not module)
        if type(module).__name__.endswith("Attention") and not inner:
            setattr(module, RECOMPUTE_ATTR, False)


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
    check_activation_names(spec.config, where, transformers.activations.ACT2FN)
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


def _get(model: nn.Module, path: str) -> Any:
    return model.get_submodule(path)


def _hidden(out: Any) -> torch.Tensor:
    """The hidden states of a block's return value (a tensor, a tuple, or a ``ModelOutput``)."""
    if isinstance(out, torch.Tensor):
        return out
    return out[0]


class Embed(nn.Module):
    """``(input_ids, attention_mask)`` -> ``(hidden, attention_mask)``."""

    def __init__(self, model_type: str, embed: nn.Module, positions: nn.Module | None) -> None:
        super().__init__()
        self.model_type = model_type
        self.embed = embed
        self.positions = positions  # GPT-2's wpe

    def forward(self, batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        ids, mask = batch
        x = self.embed(ids)
        if self.positions is not None:
            x = x + self.positions(torch.arange(ids.size(1), device=ids.device))
        return _hidden(x), mask


class Block(nn.Module):
    """One transformer block of the model, called as the model's own forward calls it."""

    def __init__(self, model_type: str, block: nn.Module, layer_idx: int, config: Any, rotary: nn.Module | None) -> None:
        super().__init__()
        self.model_type = model_type
        self.block = block
        self.layer_idx = layer_idx
        self.rotary = rotary
        object.__setattr__(self, "_config", config)  # not a submodule

    def _mask(self, x: torch.Tensor, pad: torch.Tensor, positions: torch.Tensor) -> Any:
        from transformers import masking_utils as mu

        cfg: Any = self._config
        # the whole sequence's mask: with sequence parallelism x holds this device's slice of the
        # tokens (the attention all-gathers them), the padding mask all of them
        x = x[:, :1].expand(x.size(0), pad.size(1), x.size(2))
        if self.model_type == "bert":
            return mu.create_bidirectional_mask(config=cfg, inputs_embeds=x, attention_mask=pad)
        sliding = self.model_type == "mistral" and cfg.sliding_window is not None
        if self.model_type == "qwen2":
            sliding = cfg.layer_types[self.layer_idx] == "sliding_attention"
        make = mu.create_sliding_window_causal_mask if sliding else mu.create_causal_mask
        return make(config=cfg, inputs_embeds=x, attention_mask=pad, cache=None, position_ids=positions)

    def _context_mask(self, shard: SequenceShard, x: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        """Context parallelism: the (b, 1, local queries, every key) boolean mask of this rank's
        tokens over the gathered keys (``SequenceShard.key_positions``), from global positions: causal,
        the sliding window where the model's layer has one, the keys' padding (``pad`` is whole)."""
        cfg: Any = self._config
        window = None
        if self.model_type == "mistral" or (self.model_type == "qwen2" and cfg.layer_types[self.layer_idx] == "sliding_attention"):
            window = cfg.sliding_window
        keys = shard.key_positions(x.size(1), x.device)
        visible = shard.causal_mask(shard.positions(x.size(1), x.device), keys, window)
        return visible[None, None] & pad[:, keys].bool()[:, None, None, :]

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        x, pad = hx
        shard = context_of(self)
        if shard is not None:  # x holds this rank's chunks of the tokens, pad the whole padding mask
            positions = shard.positions(x.size(1), x.device).unsqueeze(0)
            mask = self._context_mask(shard, x, pad)
        else:
            positions = torch.arange(pad.size(1), device=x.device).unsqueeze(0)  # every token's (see _mask)
            mask = self._mask(x, pad, positions)
        if self.model_type == "bert":
            out = self.block(x, mask)
        elif self.model_type == "gpt2":
            out = self.block(x, attention_mask=mask)
        else:
            assert self.rotary is not None
            out = self.block(x, attention_mask=mask, position_ids=positions, position_embeddings=self.rotary(x, positions))
        return _hidden(out), pad


class Norm(nn.Module):
    """The final norm; drops the padding mask (the head does not attend)."""

    def __init__(self, norm: nn.Module) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        return self.norm(hx[0])


class Head(nn.Module):
    def __init__(self, head: nn.Module, takes_tuple: bool) -> None:
        super().__init__()
        self.head = head
        self.takes_tuple = takes_tuple  # no final norm before it: it receives (hidden, mask)

    def forward(self, x: Any) -> torch.Tensor:
        return _hidden(self.head(x[0] if self.takes_tuple else x))


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(summed cross entropy of the labelled tokens, their number)``: HF's token-mean loss
    in the Workload contract's ``(sum, count)`` form."""
    total = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
    return total, (labels != IGNORE).sum()


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
        make_batch = _batch_maker(family.task, vocab, seq, spec.padding, pad_id)
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


def _batch_maker(task: str, vocab: int, seq: int, padding: bool, pad_id: int) -> Callable[[int, int], Any]:
    def make_batch(batch_size: int, seed: int) -> tuple[tuple[torch.Tensor, torch.Tensor], torch.Tensor]:
        gen = generator(seed)
        tokens = torch.randint(vocab, (batch_size, seq + 1), generator=gen)
        lengths = torch.randint(seq // 2 + 1, seq + 1, (batch_size,), generator=gen) if padding else torch.full((batch_size,), seq)
        mask = (torch.arange(seq)[None, :] < lengths[:, None]).long()
        if task == "causal-lm":
            ids, labels = tokens[:, :-1].clone(), tokens[:, 1:].clone()
        else:
            ids = tokens[:, :-1].clone()
            chosen = (torch.rand(batch_size, seq, generator=gen) < MASK_FRACTION) & mask.bool()
            chosen[:, 0] |= ~chosen.any(dim=1)  # at least one masked token a sample
            labels = torch.where(chosen, ids, torch.full_like(ids, IGNORE))
            ids = torch.where(chosen, torch.full_like(ids, vocab - 1), ids)
        ids = torch.where(mask.bool(), ids, torch.full_like(ids, pad_id))
        labels = torch.where(mask.bool(), labels, torch.full_like(labels, IGNORE))
        return (ids, mask), labels

    return make_batch
