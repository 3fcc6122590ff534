"""The model zoo and model-spec resolution (imports torch).

Spec syntax (``planner profile --model SPEC``, :func:`load_workload`):

- ``NAME`` or ``NAME:key=value,key=value`` for a zoo model; names and options:

  - ``gpt``: layers, hidden, heads, seq, vocab, granularity (GPT-style decoder, LM head tied
    to the token embedding, recorded in ``Workload.tied``; ``granularity=sublayer`` makes the
    attention and MLP halves of each block separate layers, for finer stage boundaries)
  - ``bert``: layers, hidden, heads, seq, vocab, classes (BERT-style encoder, pooled classifier)
  - ``vgg``: convs, width, pool_every, image, classes (VGG-style CNN)
  - ``resnet``: blocks, width, image, classes (ResNet-style CNN, skips span layers)
  - ``gpt2``: layers, hidden, heads, seq, vocab (``transformers`` GPT-2 from a GPT2Config,
    random weights; needs the optional ``transformers``)

  every zoo model also takes ``seed`` (weights, default 0) and ``dtype``
  (``float32`` default, ``float64``, ``bfloat16``): the dtype of the parameters and of the
  floating inputs ``make_batch`` returns. Token ids and labels are always int64.
- ``hf:CONFIG[:key=value,...]``: a Hugging Face ``transformers`` model from a ``config.json``,
  a directory holding one, or a ``model_type`` with its fields inline, random seeded weights
  (:mod:`planner.models.hf`; options: config fields or layers, hidden, heads, kv_heads,
  intermediate, vocab, and seq, seed, dtype, padding)
- ``package.module:callable`` or ``package.module:callable:key=value,...``: a user factory
  returning a :class:`planner.models.workload.Workload`; options become keyword arguments
  (``int`` if they parse as one, else ``float``, else ``str``).

Layers are called as ``out = layers[i](out)``: a layer that returns a tuple hands the whole
tuple to the next layer as one argument. Weights and batches are seeded; nothing is
downloaded.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.profile import profile_fingerprint
from planner.models import bert, gpt, hf, hf_gpt2, resnet, vgg
from planner.models.spec import build_config, load_factory, split_options
from planner.models.workload import Workload

__all__ = ["ZOO", "layer_param_names", "layer_param_shapes", "load_workload", "workload_fingerprint"]

# zoo name -> (config dataclass, builder)
ZOO: dict[str, tuple[type, Callable[[Any], Workload]]] = {
    "gpt": (gpt.GPTConfig, gpt.build),
    "bert": (bert.BERTConfig, bert.build),
    "vgg": (vgg.VGGConfig, vgg.build),
    "resnet": (resnet.ResNetConfig, resnet.build),
    "gpt2": (hf_gpt2.GPT2Options, hf_gpt2.build),
}


def load_workload(spec: str, *, dtype: str | None = None) -> Workload:
    """Resolve a model spec (see the module docstring) to a :class:`Workload`.

    ``dtype``, when given, overrides the zoo model's ``dtype`` option (ignored for factories,
    which own their dtype). Raises :class:`PlannerInputError` on any bad spec.
    """
    spec = spec.strip()
    head, _, rest = spec.partition(":")
    if head == "hf":
        return hf.build(hf.parse_spec(rest, spec, dtype), f"model spec {spec!r}")
    if head in ZOO:
        cls, builder = ZOO[head]
        options = split_options(rest, spec)
        if dtype is not None:
            options["dtype"] = dtype
        config = build_config(cls, options, spec)
        try:
            return builder(config)
        except (ValueError, RuntimeError) as exc:
            raise PlannerInputError(f"model spec {spec!r}: {' '.join(str(exc).split())}") from None
    attr, _, opts = rest.partition(":")
    if not head or not attr or "=" in attr:
        raise PlannerInputError(
            f"model spec {spec!r}: unknown zoo model {head!r} (zoo: {', '.join(ZOO)};"
            " or give package.module:callable)"
        )
    return load_factory(f"{head}:{attr}", split_options(opts, spec), spec)


def layer_param_shapes(workload: Workload) -> tuple[tuple[tuple[int, ...], ...], ...]:
    """Per layer, the shapes of its parameters in ``named_parameters()`` order."""
    return tuple(tuple(tuple(p.shape) for _, p in layer.named_parameters()) for layer in workload.layers)


def layer_param_names(workload: Workload) -> tuple[tuple[str, ...], ...]:
    """Per layer, the names of its parameters in ``named_parameters()`` order."""
    return tuple(tuple(name for name, _ in layer.named_parameters()) for layer in workload.layers)


def workload_fingerprint(workload: Workload) -> str:
    """The fingerprint a Profile of this workload carries (layer names, parameter shapes and
    the model's configuration, ``Workload.model_config``)."""
    return profile_fingerprint(workload.layer_names, layer_param_shapes(workload), workload.model_config)
