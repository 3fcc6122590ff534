"""``planner profile``: measure a torch model (``--model SPEC``) or build an analytic GPT
profile (``--analytic gpt``) or Llama-style one from a Hugging Face config (``--analytic hf
--config config.json``) and write the Profile JSON.

Torch is imported only when a model is measured.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.flag_values import parse_int
from planner.artifacts.profile import Profile, save_profile
from planner.commands._args import Subcommand, bounded_int, check_output
from planner.profiling.analytic.gemm import GemmModel

EPILOG = """\
model specs:
  gpt | bert | vgg | resnet | gpt2 [:key=value,...]
                                               zoo models, e.g. gpt:layers=4,hidden=64,heads=4,seq=32,vocab=256
                                               (every zoo model also takes seed=N and dtype=float32|float64|bfloat16;
                                               gpt2 is transformers' GPT-2 and needs the hf extra)
  hf:CONFIG[:key=value,...]                     a transformers model from a config.json (or a directory holding one,
                                               or a model_type: hf:llama:layers=2,hidden=64,heads=4,kv_heads=2),
                                               random seeded weights; llama, mistral, qwen2, gpt2, bert, t5
  package.module:callable[:key=value,...]      a factory returning planner.Workload; it runs in this process,
                                               and whatever it does is reported in one line with exit 2: an
                                               exception, sys.exit, os._exit / os.abort, calling the planner
                                               again, or not returning within PLANNER_FACTORY_TIMEOUT_S seconds
                                               (default 600)

examples:
  planner profile --model resnet:blocks=4,width=16 --microbatch-sizes 1,2,4 --out resnet.json
  planner profile --analytic gpt --layers 24 --hidden 2048 --heads 16 --seq 2048 --vocab 51200 \\
      --device-preset a100-80gb --out gpt3-1.3b.json
  planner profile --analytic hf --config configs/llama-3-8b.json --device-preset h100-80gb --out llama-3-8b-h100.json
"""


#: the --analytic size flags and their help
ANALYTIC_SIZES = {
    "layers": "transformer blocks (--analytic gpt)",
    "hidden": "hidden size h (--analytic gpt)",
    "heads": "attention heads a (--analytic gpt)",
    "seq": "tokens per sample s (--analytic gpt; --analytic hf: default the config's max_position_embeddings)",
    "vocab": "vocabulary size (--analytic gpt)",
}


def _parser() -> argparse.ArgumentParser:
    """``planner profile``'s arguments (:data:`COMMAND`)."""
    parser = argparse.ArgumentParser(
        add_help=False,
        description=__doc__.split("\n\n")[0],
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", metavar="SPEC",
                      help="zoo model (gpt, bert, vgg, resnet, gpt2), hf:CONFIG, or package.module:callable (see below)")
    what.add_argument("--analytic", choices=["gpt", "hf"],
                      help="analytic profile from cited formulas (no torch); hf: a Llama-style or mixture-of-experts "
                           "(qwen3_moe, mixtral, gpt_oss, deepseek_v3) --config")
    parser.add_argument("--out", metavar="PATH", help="profile JSON to write (default: <model>.profile.json)")
    measured = parser.add_argument_group("measured (--model)")
    measured.add_argument("--microbatch-sizes", default="1,2,4", metavar="B,B,...", help="sizes to measure (default 1,2,4)")
    measured.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                          help="where the layers are timed: cpu, or cuda (the first visible GPU; default cpu)")
    measured.add_argument("--dtype", choices=["float32", "bfloat16", "float64"], default=None, help="default: the model's own")
    measured.add_argument("--warmup", type=bounded_int(0, 1000), default=2, help="untimed runs per layer (default 2)")
    measured.add_argument("--repeats", type=bounded_int(1, 1000), default=5, help="timed runs per layer, median kept (default 5)")
    measured.add_argument("--threads", type=bounded_int(1, 4096), default=None, help="torch CPU threads (default: torch's)")
    measured.add_argument("--no-progress", action="store_true",
                          help="no progress (default: a bar on a terminal, else a line every PLANNER_PROGRESS_EVERY_S "
                               "seconds, default 5)")
    measured.add_argument("--verbose", action="store_true",
                          help="also warn of each layer torch.fx cannot trace (default: named in the profile's metadata "
                               "only, fx_untraced_layers)")
    analytic = parser.add_argument_group("analytic (--analytic gpt | hf)")
    for flag, what in ANALYTIC_SIZES.items():
        analytic.add_argument(f"--{flag}", type=bounded_int(1, 2**24), help=what)
    analytic.add_argument("--config", metavar="PATH",
                          help="--analytic hf: a config.json or a directory holding one "
                               "(--seq default: its max_position_embeddings)")
    analytic.add_argument("--device-preset", default="a100-80gb", help="a100-80gb | h100-80gb | h200-141gb | b200 | gb200 "
                           "(default a100-80gb)")
    analytic.add_argument("--attention", choices=["flash", "materialised"], default="flash",
                          help="--analytic gpt: FlashAttention (no s x s tensor saved; default) or materialised "
                               "scores (Korthikanti et al. 2022 eq. 1)")
    analytic.add_argument("--gemm", metavar="E_MAX,I_HALF,MEM_EFF", default="",
                          help="the device's GEMM model: the largest GEMMs' fraction of peak, the arithmetic intensity "
                               "(FLOP/byte) at half of that, and the achieved fraction of HBM bandwidth "
                               "(planner.profiling.analytic.gemm; default: the preset's constants fitted on published runs)")
    return parser


#: the largest micro-batch measured (a batch of it is built in memory)
MAX_MEASURED_MICROBATCH = 65_536


def parse_sizes(text: str) -> tuple[int, ...]:
    """``"1,2,4"`` -> ``(1, 2, 4)``; anything else is an input error."""
    try:  # each item an integer written as digits, none empty ("1,,2" was read as 1,2)
        return tuple(parse_int(part.strip(), 1, MAX_MEASURED_MICROBATCH) for part in text.split(","))
    except ValueError:
        raise PlannerInputError(f"--microbatch-sizes must be integers in [1, {MAX_MEASURED_MICROBATCH:,}] like 1,2,4 "
                                f"(got {text[:40]!r})") from None


def parse_gemm(text: str) -> GemmModel | None:
    """``--gemm E_MAX,I_HALF,MEM_EFF`` as a GEMM model (None when not given)."""
    if not text:
        return None
    try:
        e_max, half, mem = (float(part) for part in text.split(","))
    except ValueError:
        raise PlannerInputError(f"--gemm must be three numbers E_MAX,I_HALF,MEM_EFF like 0.8,150,0.5 (got {text!r})") from None
    return GemmModel(max_efficiency=e_max, half_intensity=half, memory_efficiency=mem, source="--gemm")


def _analytic(args: argparse.Namespace) -> Profile:
    """The analytic profile the flags ask for; a size the formulas cannot hold (a count past
    ``planner.artifacts.limits``) is an input error naming the flags' source."""
    try:
        return _analytic_gpt(args) if args.analytic == "gpt" else analytic_hf_profile(
            args.config, seq=args.seq, device_preset=args.device_preset, gemm=parse_gemm(args.gemm))
    except ValueError as exc:
        if isinstance(exc, PlannerInputError):
            raise
        source = f"--config {args.config}" if args.analytic == "hf" else "--analytic gpt"
        raise PlannerInputError(f"{source}: {' '.join(str(exc).split())}") from None


def _analytic_gpt(args: argparse.Namespace) -> Profile:
    from planner.profiling.analytic.gpt import gpt_profile

    missing = [f"--{f}" for f in ("layers", "hidden", "heads", "seq", "vocab") if getattr(args, f) is None]
    if missing:
        raise PlannerInputError(f"--analytic gpt needs {', '.join(missing)}")
    return gpt_profile(
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        seq=args.seq,
        vocab=args.vocab,
        device_preset=args.device_preset,
        attention=args.attention,
        gemm=parse_gemm(args.gemm),
    )


def analytic_hf_profile(config: str | None, *, seq: int | None = None, device_preset: str = "a100-80gb",
                        gemm: GemmModel | None = None) -> Profile:
    """``planner profile --analytic hf --config CONFIG``: the analytic profile of a Hugging Face
    config file (or a directory holding one): Llama-style, or a mixture-of-experts family
    (``qwen3_moe``, ``mixtral``, ``gpt_oss``, ``deepseek_v3``: :mod:`planner.profiling.analytic.moe`)."""
    from planner.profiling.analytic.llama import LLAMA_TYPES, llama_profile, read_config
    from planner.profiling.analytic.moe import moe_profile
    from planner.profiling.analytic.moe_shapes import MOE_TYPES

    if not config:
        raise PlannerInputError("--analytic hf needs --config PATH (a config.json or a directory holding one)")
    if seq is not None and seq < 1:
        raise PlannerInputError(f"--seq must be >= 1 (got {seq})")
    path = Path(config)
    try:
        data = read_config(path)
        if data.get("model_type") not in LLAMA_TYPES + MOE_TYPES:
            raise PlannerInputError(f"--config {config}: model_type {data.get('model_type')!r} has no analytic profile "
                                    f"(Llama-style: {', '.join(LLAMA_TYPES)}; mixture of experts: {', '.join(MOE_TYPES)})")
        build = moe_profile if data.get("model_type") in MOE_TYPES else llama_profile
        return build(
            data,
            seq=seq,
            device_preset=device_preset,
            gemm=gemm,
            model=(path.name if path.is_dir() else path.stem),
            source=str(config),
        )
    except PlannerInputError as exc:  # the config's shape checks name "llama config": name the file
        if str(config) in str(exc):
            raise
        raise PlannerInputError(f"--config {config}: {exc}") from None


def _measured(args: argparse.Namespace) -> Profile:
    from planner.models.spec import check_spec

    sizes = parse_sizes(args.microbatch_sizes)
    check_spec(args.model, dtype=args.dtype)  # what can be refused before torch is imported (seconds) is refused here

    from planner.artifacts.progress import Progress

    with Progress("profile", enabled=not args.no_progress) as progress:  # torch's import and the model: seconds
        progress.detail = "importing torch, building the model"
        from planner.models import load_workload
        from planner.profiling.measured import profile_model

        workload = load_workload(args.model)
    return profile_model(
        workload,
        microbatch_sizes=sizes,
        device=args.device,
        dtype=args.dtype,
        warmup=args.warmup,
        repeats=args.repeats,
        num_threads=args.threads,
        progress=not args.no_progress,
        verbose=args.verbose,
    )


def run(args: argparse.Namespace) -> int:
    check_output("--out", args.out)
    profile = _analytic(args) if args.analytic else _measured(args)
    out = Path(args.out or f"{profile.model}.profile.json")
    try:
        save_profile(profile, out)
    except OSError as exc:
        raise PlannerInputError(f"--out {out}: cannot write ({exc.strerror or exc})") from None
    b = profile.microbatch_sizes[0]
    fwd = sum(layer.fwd_ms(b) for layer in profile.layers)
    bwd = sum(layer.bwd_ms(b) for layer in profile.layers)
    params = sum(layer.param_count for layer in profile.layers) - sum(t.param_count * (len(t.layers) - 1) for t in profile.tied)
    selective = sum(layer.attention_core is not None for layer in profile.layers)
    print(
        f"{profile.model}: {profile.num_layers} layers, {params:,} parameters, "
        f"fwd {fwd:.3f} ms + bwd {bwd:.3f} ms at micro-batch {b} on {profile.device}, "
        f"attention {profile.attention.value} ({selective} layers with a selective level) -> {out}"
    )
    return 0


COMMAND = Subcommand(name="profile", parser=_parser(), run=run,
                     help="measure a torch model (zoo, hf:CONFIG, your own) or build an analytic GPT or Llama profile into a profile JSON")
