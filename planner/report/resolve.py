"""Resolve what a comparison or a calibration is given: plans and run reports by value or path,
the profile and cluster a plan was made from, and which run report measured which plan.

No torch. Shared by :mod:`planner.report.compare` and :mod:`planner.report.calibrate`.

Finding a plan's inputs (``plan.provenance`` records their sha256, not their paths):

- profile: the one given (a :class:`Profile` or a path); else a JSON file in the plan file's
  folder or in the shipped ``profiles/`` folder whose canonical sha256 equals
  ``provenance.profile_sha256``. Only what is needed is read: regular files of at most
  ``MAX_INPUT_BYTES`` (a FIFO, a socket, a directory named ``*.json`` is passed over without
  being opened), a file whose parsed JSON is not a profile is not decoded, the files naming
  the plan's model are tried first, a canonical file (what ``save_profile`` writes) is matched
  by the sha256 of its parsed text, any other decoded and its encoding hashed (an older
  version's file hashes differently until upgraded; the shipped profiles are such files). A
  file that cannot be read or is no valid profile is skipped, never fatal;
- cluster: the one given (a :class:`Cluster`, a preset name or a path); else the preset named
  ``provenance.cluster_name`` (as it is, cut to the plan's devices, or grown to the devices the
  plan had, ``planner plan --devices N``) when its sha256 matches ``provenance.cluster_sha256``.

Matching a RunReport to a plan (a RunReport names the model's fingerprint, not the plan's
sha): the same model (its name, unless both carry the same fingerprint: a run names its
model by its spec, a plan by its profile's name), and the plan's *signature* -- P, D, M,
micro-batch size, schedule, the ranks of each stage, each stage's predicted compute
``M x (fwd + bwd + recompute)`` and the predicted iteration time -- must equal what the
report copied from the plan it ran (floats to 1e-9 relative).
Two plans with the same signature are the same plan for this purpose.
"""

from __future__ import annotations

import math
import stat
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.cluster import PRESETS, Cluster, cluster_to_json, load_cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.limits import MAX_INPUT_BYTES
from planner.artifacts.plan import Plan, load_plan
from planner.artifacts.profile import SCHEMA as PROFILE_SCHEMA
from planner.artifacts.profile import Profile, load_profile, profile_from_json, profile_to_json
from planner.artifacts.report import RunReport, load_report
from planner.profiling.defaults import profiles_dir

__all__ = [
    "ClusterLike",
    "PlanLike",
    "ProfileLike",
    "ReportLike",
    "find_cluster",
    "find_profile",
    "load_plans",
    "load_reports",
    "match_report",
    "report_mismatch",
]

PlanLike = Plan | str | Path
ProfileLike = Profile | str | Path
ClusterLike = Cluster | str | Path
ReportLike = RunReport | str | Path


def load_plans(items: Sequence[PlanLike]) -> list[tuple[str, Plan, Path | None]]:
    """(label, plan, path) for each item; the label is the file's stem or the plan's solver,
    made unique with ``#2``, ``#3`` suffixes."""
    if isinstance(items, (Plan, str, Path)):
        items = [items]
    out: list[tuple[str, Plan, Path | None]] = []
    seen: dict[str, int] = {}
    for item in items:
        if isinstance(item, Plan):
            plan, path, label = item, None, item.provenance.solver.value
        elif isinstance(item, (str, Path)):
            path = Path(item)
            plan, label = load_plan(path), path.stem  # a missing or special file: one line from the codec
        else:
            raise PlannerInputError(f"expected a Plan or a path to a plan JSON, got {type(item).__name__}")
        seen[label] = seen.get(label, 0) + 1
        out.append((label if seen[label] == 1 else f"{label}#{seen[label]}", plan, path))
    if not out:
        raise PlannerInputError("no plans to compare")
    return out


def load_reports(items: Sequence[ReportLike]) -> list[RunReport]:
    return [item if isinstance(item, RunReport) else load_report(item) for item in items]


def _sha_profile(profile: Profile) -> str:
    return codec.sha256_of(profile_to_json(profile))


def find_profile_path(plan: Plan, plan_path: Path | None = None) -> str:
    """The path of the profile ``plan`` was made from, beside it or in profiles/ ("" when none
    is found; see :func:`find_profile`)."""
    try:
        return str(_search_profile(plan, plan_path)[1])
    except PlannerInputError:
        return ""


def find_profile(plan: Plan, given: ProfileLike | None = None, plan_path: Path | None = None) -> Profile:
    """The profile ``plan`` was made from (see the module docstring)."""
    if isinstance(given, Profile):
        return given
    if given is not None:
        return load_profile(given)
    return _search_profile(plan, plan_path)[0]


def _search_profile(plan: Plan, plan_path: Path | None) -> tuple[Profile, Path]:
    """Files naming the plan's model first (decoding a profile costs about 0.1 s; profiles/ holds
    15), then in folder order (beside the plan, then profiles/) and by name."""
    want = plan.provenance.profile_sha256
    folders = [p for p in (plan_path.parent if plan_path else None, profiles_dir()) if p is not None and p.is_dir()]
    found: list[tuple[Path, dict[str, Any]]] = []
    for folder in folders:
        for path in _regular_json_files(folder):
            try:
                data = codec.read_json(path)
            except PlannerInputError:
                continue  # unreadable, not JSON: not the profile
            if isinstance(data, dict) and data.get("schema") == PROFILE_SCHEMA:
                found.append((path, data))
    found.sort(key=lambda item: item[1].get("model") != plan.provenance.model)  # stable
    for path, data in found:
        try:
            if codec.sha256_of(data) == want:  # a canonical file: its text is its encoding
                return profile_from_json(data, str(path)), path
            candidate = profile_from_json(data, str(path))  # an older version, a hand-written file
        except PlannerInputError:
            continue
        if _sha_profile(candidate) == want:
            return candidate, path
    where = " or ".join(str(f) for f in folders)
    raise PlannerInputError(
        f"the profile of plan {plan.provenance.solver.value!r} ({plan.provenance.model}, sha256 {want[:12]}) "
        f"is not in {where}; pass it (--profile)"
    )


def _regular_json_files(folder: Path) -> list[Path]:
    """``folder/*.json`` that are regular files of at most ``MAX_INPUT_BYTES``, sorted; anything
    else is passed over without being opened (a FIFO would block the read)."""
    out = []
    for path in sorted(folder.glob("*.json")):
        try:
            st = path.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_INPUT_BYTES:
            out.append(path)
    return out


def find_cluster(plan: Plan, given: ClusterLike | None = None) -> Cluster:
    """The cluster ``plan`` was made for (see the module docstring)."""
    if isinstance(given, Cluster):
        return given
    if given is not None:
        return load_cluster(given)
    prov = plan.provenance
    preset = PRESETS.get(prov.cluster_name)
    if preset is not None:  # as planned: the preset itself, cut to the plan's devices, or grown to --devices
        for devices in sorted({preset.num_devices, plan.num_devices, plan.devices_available} - {0}):
            candidates = [preset.grown_to(devices)]
            try:
                candidates.append(preset.with_devices(devices))
            except PlannerInputError:
                pass
            for candidate in candidates:
                if codec.sha256_of(cluster_to_json(candidate)) == prov.cluster_sha256:
                    return candidate
    raise PlannerInputError(
        f"the cluster of plan {prov.solver.value!r} ({prov.cluster_name!r}, sha256 {prov.cluster_sha256[:12]}) "
        "is not a preset; pass it (--cluster)"
    )


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


def report_mismatch(plan: Plan, report: RunReport) -> str:
    """Why ``report`` is not a run of ``plan`` ('' when it is)."""
    fp = plan.provenance.fingerprint_sha256
    if fp and report.plan_fingerprint_sha256 and fp != report.plan_fingerprint_sha256:
        return "model fingerprint differs"
    if report.model != plan.provenance.model and not (fp and fp == report.plan_fingerprint_sha256):
        return f"model {report.model[:60]!r} is not the plan's {plan.provenance.model[:60]!r}"
    got = (report.layout.num_stages, report.layout.dp_degree, report.num_microbatches, report.microbatch_size,
           report.schedule.value)
    want = (plan.layout.num_stages, plan.layout.dp_degree, plan.num_microbatches, plan.microbatch_size, plan.schedule.value)
    if got != want:
        return f"(P, D, M, mb, schedule) {got} != plan's {want}"
    if not _close(report.iteration_ms_predicted, plan.predicted.iteration_ms):
        return f"predicted iteration {report.iteration_ms_predicted} ms != plan's {plan.predicted.iteration_ms} ms"
    for rec, stage in zip(report.stages, plan.stages):
        compute = plan.num_microbatches * (stage.fwd_ms + stage.bwd_ms + stage.recompute_ms)
        if tuple(rec.ranks) != tuple(stage.ranks) or not _close(rec.compute_ms_predicted, compute):
            return f"stage {stage.stage_idx}'s ranks or predicted compute differ"
    return ""


def match_report(plans: Sequence[Plan], report: RunReport, source: str = "run report") -> int:
    """Index of the plan ``report`` measured; raises naming why the closest plan does not match."""
    reasons = []
    for i, plan in enumerate(plans):
        why = report_mismatch(plan, report)
        if not why:
            return i
        reasons.append(f"plan {i}: {why}")
    raise PlannerInputError(f"{source} matches none of the plans ({'; '.join(reasons)})")
