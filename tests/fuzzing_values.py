"""Hostile values beyond a file's syntax (issue 52), shared by tests/test_fuzz.py and
benchmarks/fuzz_loaders.py. Three families, each with its oracle:

- ``run-flags``: every number ``planner run`` takes, set to a hostile text (``nan``, ``1e400``,
  ``5e-324``, ``1_000``, ``0x10``, full-width digits, ...) or a valid one, parsed the way the
  launcher does (its parser, then the ranks' own parser and ``RuntimeOptions`` over the argv
  torchrun would get: ``planner.commands.run.check_flags``). Oracle, the flag's documented
  range (``planner.runtime.options.RANGES``, ``--nproc`` 1 to 2^20) over numbers written
  as a plain decimal (an integer flag: digits only): inside, accepted; outside, refused in one
  line naming the flag and the text; no torchrun is started either way.
- ``hf-values``: a field of ``configs/llama-3-8b.json`` of a value family (probability,
  epsilon, activation, positive number, flag) set to a hostile JSON value, read as ``hf:`` specs
  are (``planner.models.spec.check_spec``, no torch). Oracle, the family's rule restated
  here: a probability is null or a number in [0, 1]; an epsilon a number in (0, 1]; an
  activation a non-empty string; ``rope_theta`` and ``initializer_range`` a number in
  (0, 1e12]; a flag a boolean.
- ``cross-field``: a valid profile (measured: shapes and fingerprint), plan or run report whose
  fields are made to contradict each other (planner/artifacts/consistency.py's checks, and the
  ranges a contradiction breaks): every mutant must be refused.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import io
import json
import math
import random
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.limits import MAX_DEVICES
from planner.runtime.options import RANGES
from tests.fuzzing import CPU_LIMIT_S, Loader, Mutant, Outcome, loaders

ROOT = Path(__file__).resolve().parents[1]
MLP = "tests.factories:mlp"
#: texts a number flag is given
HOSTILE_NUMBERS = ("0", "-1", "nan", "inf", "-inf", "1e400", "-1e400", "5e-324", "1e40", "1_000", "1e308", " 5", "５",
                   "0x10", "1.5", "", "1e3", "+3", "3.", ".5", "00", "1e-13", "10", "10.000001", "604800", "604801",
                   "2147483647", "2147483648", "9223372036854775808", "7", "0.01", "2", "1" * 100)
#: values a config field is given
HOSTILE_VALUES: tuple[Any, ...] = (None, True, False, "x", "", 0, -1, 0.5, 1, 2, 1e308, -1e35, 5e-324, [], {}, "silu")
#: config fields of each value family
FAMILIES = {"attention_dropout": "probability", "rms_norm_eps": "epsilon", "hidden_act": "activation",
            "rope_theta": "positive", "initializer_range": "positive", "tie_word_embeddings": "flag",
            "attention_bias": "flag", "mlp_bias": "flag"}


# ---------------------------------------------------------------- run flags


def _flag_ranges() -> dict[str, tuple[float, float, bool]]:
    """flag -> (low, high, integer?)"""
    out = {flag: (lo, hi, isinstance(lo, int)) for flag, lo, hi in RANGES.values() if not flag.startswith("--fault")}
    out["--nproc"] = (1, MAX_DEVICES, True)
    return out


def flag_must_refuse(text: str, lo: float, hi: float, integer: bool) -> bool:
    """The documented rule: a plain decimal (an integer flag: digits only) within [lo, hi]."""
    if integer:
        return not (re.fullmatch(r"[+-]?[0-9]{1,40}", text) and lo <= int(text) <= hi)
    if not re.fullmatch(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?", text):
        return True
    value = float(text)
    return not (math.isfinite(value) and lo <= value <= hi)


@dataclass(frozen=True)
class FlagCase:
    flag: str
    text: str
    must_refuse: bool


def flag_cases(rng: random.Random, count: int) -> Iterator[FlagCase]:
    ranges = _flag_ranges()
    flags = sorted(ranges)
    for i in range(count):
        flag = flags[i % len(flags)]
        text = rng.choice(HOSTILE_NUMBERS)
        yield FlagCase(flag, text, flag_must_refuse(text, *ranges[flag]))


def run_flag_case(case: FlagCase, plan: str, checkpoint_dir: str) -> Outcome:
    """Parse ``planner run PLAN --model M --checkpoint-dir D FLAG=TEXT`` as the launcher does."""
    from planner.commands.cli import build_parser
    from planner.commands.run import check_flags

    argv = ["run", plan, "--model", MLP, "--checkpoint-dir", checkpoint_dir, f"{case.flag}={case.text}"]
    err = io.StringIO()
    cpu = time.process_time()
    refused, text = False, ""
    try:
        with contextlib.redirect_stderr(err):
            args: argparse.Namespace = build_parser("run").parse_args(argv)
        check_flags(args)
    except SystemExit as exc:
        refused, text = exc.code == 2, err.getvalue().strip()
    except PlannerInputError as exc:
        refused, text = True, str(exc)
    except BaseException as exc:
        return Outcome(f"crash: {type(exc).__name__}: {str(exc)[:200]}", False, time.process_time() - cpu)
    used = time.process_time() - cpu
    if refused:
        if not case.must_refuse:
            return Outcome(f"refused a valid value: {text[:160]!r}", True, used)
        if "\n" in text or case.flag not in text or case.text[:30] not in text:
            return Outcome(f"refusal not one line naming the flag and value: {text[:200]!r}", True, used)
        return Outcome("" if used <= CPU_LIMIT_S else f"slow refusal: {used:.1f} s CPU", True, used)
    return Outcome("silent acceptance" if case.must_refuse else "", False, used)


# ---------------------------------------------------------------- hf: config values


def value_must_refuse(family: str, value: Any) -> bool:
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    ok = {
        "probability": value is None or (number and 0 <= value <= 1),
        "epsilon": number and 0 < value <= 1,
        "activation": isinstance(value, str) and value != "",
        "positive": number and 0 < value <= 1e12,
        "flag": isinstance(value, bool),
    }[family]
    return not ok


def hf_value_loader() -> Loader:
    from planner.models.spec import check_spec

    text = (ROOT / "configs" / "llama-3-8b.json").read_text()
    return Loader(name="hf-values", text=text, load=lambda p: check_spec(f"hf:{p}"))


def hf_value_mutants(rng: random.Random, count: int) -> Iterator[Mutant]:
    base = json.loads(hf_value_loader().text)
    fields = sorted(FAMILIES)
    for i in range(count):
        field = fields[i % len(fields)]
        value = rng.choice(HOSTILE_VALUES)
        if FAMILIES[field] == "activation" and isinstance(value, str) and value not in ("", "silu"):
            value = "silu"  # an unknown name is refused later, with transformers (tests/test_hf_values.py)
        doc = dict(base, **{field: value})
        yield Mutant(f"{field}={json.dumps(value)[:20]}", json.dumps(doc).encode(), value_must_refuse(FAMILIES[field], value))


# ---------------------------------------------------------------- cross-field contradictions


def _profile_edits() -> list[tuple[str, Callable[[Any], None]]]:
    def layer(d: Any) -> Any:
        return d["layers"][1]

    return [
        ("param_bytes 2^61", lambda d: layer(d).update(param_bytes=2**61)),
        ("param_bytes x3", lambda d: layer(d).update(param_bytes=layer(d)["param_bytes"] * 3)),
        ("param_bytes / 4", lambda d: layer(d).update(param_bytes=layer(d)["param_bytes"] // 4)),
        ("param_shapes empty", lambda d: layer(d).update(param_shapes=[])),
        ("param_shapes [[]]", lambda d: layer(d).update(param_shapes=[[]])),
        ("param_shapes 10^6 dims", lambda d: layer(d).update(param_shapes=[[1] * 10**6])),
        ("param_shapes one dropped", lambda d: layer(d).update(param_shapes=layer(d)["param_shapes"][1:])),
        ("param_shapes a dim doubled", lambda d: layer(d)["param_shapes"][0].__setitem__(0, layer(d)["param_shapes"][0][0] * 2)),
        ("fingerprint changed", lambda d: d.update(fingerprint_sha256="0" * 64)),
        ("layer renamed", lambda d: layer(d).update(name="renamed")),
        ("tied param_bytes x4", lambda d: d["tied"][0].update(param_bytes=d["tied"][0]["param_bytes"] * 4)),
    ]


def _plan_edits() -> list[tuple[str, Callable[[Any], None]]]:
    def pred(d: Any) -> Any:
        return d["predicted"]

    return [
        ("iteration_ms 1e-9", lambda d: pred(d).update(iteration_ms=1e-9)),
        ("iteration_ms below partition_bound", lambda d: pred(d).update(iteration_ms=pred(d)["partition_bound_ms"] * 0.5)),
        ("stage fwd_ms x1e6", lambda d: d["stages"][0].update(fwd_ms=d["stages"][0]["fwd_ms"] * 1e6 + 1.0)),
        ("memory_total_bytes 1", lambda d: d["stages"][0].update(memory_total_bytes=1)),
        ("memory_total_bytes x2", lambda d: d["stages"][-1].update(memory_total_bytes=d["stages"][-1]["memory_total_bytes"] * 2)),
        ("throughput x1000", lambda d: pred(d).update(throughput_samples_per_s=pred(d)["throughput_samples_per_s"] * 1000)),
        ("schedules twice", lambda d: d["provenance"]["request"].update(schedules=["1f1b", "1f1b"])),
        ("schedules 10^6", lambda d: d["provenance"]["request"].update(schedules=["gpipe"] * 10**6)),
    ]


def _report_edits() -> list[tuple[str, Callable[[Any], None]]]:
    return [
        ("no steps", lambda d: d.update(steps=[])),
        ("a step twice", lambda d: d["steps"].append(dict(d["steps"][0]))),
        ("steps out of order", lambda d: d["steps"].insert(0, dict(d["steps"][0], step_idx=5))),
        ("negative loss", lambda d: d["steps"][0].update(loss=-0.5)),
        ("loss 2^64", lambda d: d["steps"][0].update(loss=2**64)),
        ("iteration_ms above its steps", lambda d: d.update(iteration_ms=d["iteration_ms"] * 10)),
        ("iteration_ms 0", lambda d: d.update(iteration_ms=0.0)),
        ("iteration_rel_error off", lambda d: d.update(iteration_rel_error=d["iteration_rel_error"] + 0.5)),
        ("stage_idx not its place", lambda d: d["stages"][0].update(stage_idx=len(d["stages"]))),
        ("20,000 stage records", lambda d: d.update(stages=[dict(d["stages"][0], stage_idx=i) for i in range(20_000)])),
    ]


def cross_field_cases() -> Iterator[tuple[Loader, Mutant]]:
    """Every contradiction of :func:`_profile_edits`, :func:`_plan_edits`, :func:`_report_edits`."""
    table = loaders()
    measured = (ROOT / "profiles" / "zoo-gpt-cpu.json").read_text()
    profile = Loader(name="profile", text=measured, load=table["profile"].load)
    for loader, edits in ((profile, _profile_edits()), (table["plan"], _plan_edits()), (table["runreport"], _report_edits())):
        for name, edit in edits:
            doc = copy.deepcopy(json.loads(loader.text))
            edit(doc)
            yield loader, Mutant(f"{loader.name}: {name}", json.dumps(doc).encode(), True)
