"""Model FLOPs are a typed field of the profile, set by whoever builds it (issue 17): the zoo
GPT workloads declare theirs, the profiler records it, the analytic profiles compute theirs,
and a plan's MFU reads nothing else."""

from __future__ import annotations

import pytest

from planner.models import load_workload
from planner.models.flops import gpt_model_flops_per_sample
from planner.profiling.analytic.gpt import gpt_profile
from planner.profiling.measured import profile_model


def test_zoo_gpt_declares_its_flops_and_the_profiler_records_them() -> None:
    work = load_workload("gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64")
    want = 3 * (2 * (24 * 8 * 32 * 32 + 4 * 8 * 8 * 32) + 2 * 8 * 32 * 64)  # Narayanan et al. 2021 eq. 3, no recompute
    assert work.model_flops_per_sample == gpt_model_flops_per_sample(layers=2, hidden=32, seq=8, vocab=64) == want
    prof = profile_model(work, microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, trace_ops=False)
    assert prof.model_flops_per_sample == want


def test_a_model_without_a_count_records_zero() -> None:
    work = load_workload("vgg:convs=2,width=4,image=8")
    assert work.model_flops_per_sample == 0.0


def test_analytic_gpt_counts_its_own() -> None:
    prof = gpt_profile(layers=4, hidden=256, heads=4, seq=128, vocab=1000)
    assert prof.model_flops_per_sample == pytest.approx(72 * 128 * 4 * 256**2 * (1 + 128 / (6 * 256) + 1000 / (12 * 4 * 256)))
