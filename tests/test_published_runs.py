"""``benchmarks/published_runs.py``: the published runs of issues 18, 19 and 47 priced with their
published configuration forced. Memory (issue 18): Korthikanti et al. 2022 Table 3 (sequence
parallelism + selective recomputation of every block's attention core), the Megatron-LM
README's H100 rows (FlashAttention, no recomputation, the distributed optimizer) and
torchtitan's FSDP rows fit in their 80 GB GPUs under our memory model, as they did when they
ran, and torchtitan's Llama 2 70B at local batch 2 with op-level recomputation does not, as it
did not; without selective recomputation or with materialised attention they would not. Time:
the selective level is priced as the planner runs it (the attention core's forward again in
every backward), and the benchmark's last line has issue 47's format. Layouts (issue 47): uneven
first / last stages, the embedding or head as a slot of its own, context parallelism."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path

import pytest

from planner.artifacts.layout import DeviceGroup

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from published_rows import Metric, PublishedRun, Recompute, all_rows
from published_runs import (
    FIT_ROWS,
    GIB,
    cluster_for,
    config_options,
    config_plan,
    loso_model,
    main,
    own_plan,
    partition,
    price,
    profile_for,
    stage_blocks,
    time_ratio,
    usable_bytes,
)

from planner.artifacts.cluster import PRESETS
from planner.artifacts.kinds import ZeroStage
from planner.cost.precision import FP8_FIT_ROWS
from planner.cost.tensor_parallel import device_cost_model
from planner.profiling.analytic.gemm import DEVICE_GEMM, DEVICE_GEMM_LOSO

ROWS = {r.label: r for r in all_rows()}
#: Korthikanti et al. 2022 Table 3's configurations (Table 5's "present work") and the Megatron-LM
#: README's H100 rows (issue 18 names 70B-462B; the smaller ones ran too)
MEMORY_ROWS = [r for r in ROWS.values() if r.label.endswith("sp+sel") or r.source == "Megatron-LM README"]
#: torchtitan's FSDP rows that ran (issue 47)
TORCHTITAN_RAN = [r for r in ROWS.values() if r.publication == "torchtitan 2024" and r.metric is Metric.TOKENS_PER_S]


def test_memory_rows_are_the_issue_rows() -> None:
    labels = {r.label for r in MEMORY_ROWS}
    assert {f"K5 {m} sp+sel" for m in ("22B", "175B", "530B", "1T")} <= labels
    assert {f"M {m}" for m in ("70B", "119B", "177B", "314B", "462B")} <= labels
    assert len(TORCHTITAN_RAN) == 8


def test_sources_and_fit_rows() -> None:
    """Four bf16 sources and the FP8 one; each source's fit rows (the FP8 source's: planner.cost.precision.
    FP8_FIT_ROWS, none since its constant is measured) are at most a third of its rows and rows of it."""
    by_source: dict[str, list[str]] = {}
    for r in ROWS.values():
        by_source.setdefault(r.publication, []).append(r.label)
    fp8 = {r.publication for r in ROWS.values() if r.precision.fp8}
    assert fp8 == {"Megatron-Bridge 25.11"} and set(by_source) == set(FIT_ROWS) | fp8
    assert set(FP8_FIT_ROWS) <= set(by_source["Megatron-Bridge 25.11"]) and 3 * len(FP8_FIT_ROWS) <= len(by_source["Megatron-Bridge 25.11"])
    for src, labels in FIT_ROWS.items():
        assert set(labels) <= set(by_source[src]) and 3 * len(labels) <= len(by_source[src]) + 2


@pytest.mark.parametrize("run", TORCHTITAN_RAN, ids=[r.label for r in TORCHTITAN_RAN])
def test_torchtitan_configurations_that_ran_fit(run: PublishedRun) -> None:
    got = price(run, DEVICE_GEMM[run.device])
    assert got.fits, f"{run.label}: {got.peak_bytes / GIB:.2f} GiB: {got.reason}"
    assert got.plan.layout.zero is ZeroStage.PARAMETERS and got.plan.layout.dp_degree == 64


def test_the_configuration_that_ran_out_of_memory_does_not_fit() -> None:
    """Llama 2 70B at local batch 2 with torchtitan's op-level recomputation ran out of memory on 80
    GB A100s; at local batch 1 it ran. Priced as the attention core (which FlashAttention saves
    nothing of) instead of the op-level policy, the batch-1 row would not fit either."""
    oom = ROWS["T L2 70B b2 sel-op"]
    assert oom.metric is Metric.OUT_OF_MEMORY
    got = price(oom, DEVICE_GEMM[oom.device])
    assert not got.fits and "activations" in got.reason
    ran = ROWS["T L2 70B b1 sel-op"]
    assert price(ran, DEVICE_GEMM[ran.device]).fits
    as_core = dataclasses.replace(ran, recompute=Recompute.SELECTIVE)
    assert not price(as_core, DEVICE_GEMM[ran.device]).fits


def test_layouts_a_row_can_express() -> None:
    """Uneven first and last stages, the embedding and the head as slots of their own, and
    context parallelism (gpus = t p d cp) are priced as given."""
    run = dataclasses.replace(ROWS["K5 175B sp+sel"], p=8, chunks=(1,), first_stage_layers=11, last_stage_layers=11)
    assert stage_blocks(run, 8) == [11, 13, 13, 12, 12, 12, 12, 11]
    assert stage_blocks(dataclasses.replace(run, p=4), 8) is None  # interleaved: the rest must divide evenly
    slots = dataclasses.replace(run, first_stage_layers=0, last_stage_layers=0, embedding_stage=True, head_stage=True)
    starts, _, selective = partition(slots, 8)
    assert starts[:2] == [0, 1] and starts[-1] == 97 and selective[0] == [] and selective[-1] == []
    plan = config_plan(slots, DEVICE_GEMM[run.device])
    assert plan.stages[0].layer_names == ("embed",) and plan.stages[-1].layer_names == ("head",)
    cp = dataclasses.replace(ROWS["T L3 8B b1 sel-layer"], d=32, cp=2, batch=32)
    assert cp.gpus == 64
    priced = config_plan(cp, DEVICE_GEMM[cp.device])
    assert priced.layout.cp_degree == 2 and priced.layout.world_size == 64


@pytest.mark.parametrize("run", MEMORY_ROWS, ids=[r.label for r in MEMORY_ROWS])
def test_published_configuration_fits_in_80_gb(run: PublishedRun) -> None:
    got = price(run, DEVICE_GEMM[run.device])
    assert got.fits, f"{run.label}: {got.peak_bytes / GIB:.2f} GiB: {got.reason}"
    assert got.plan.predicted.peak_memory_bytes <= usable_bytes(run) < PRESETS[run.preset].device_memory_bytes
    selective = run.recompute is Recompute.SELECTIVE
    for stage in got.plan.stages:
        blocks = [i for i in range(stage.layer_start, stage.layer_stop) if 1 <= i <= run.layers]
        assert list(stage.recompute_selective) == (blocks if selective else [])
        assert not stage.recompute
    assert got.plan.layout.tp_degree == run.t and got.plan.layout.dp_degree == run.d
    assert got.plan.layout.pipeline_size == run.p
    # as published, or where the source gives none one of those tried (the faster that fits)
    assert got.plan.microbatch_size in (run.microbatches or (run.microbatch,))


def test_what_selective_recomputation_and_flash_attention_save() -> None:
    """Korthikanti's 1T without its selective recomputation, and the Megatron 462B row with
    materialised attention, do not fit: the two mechanisms are what makes these runs fit."""
    one_t = dataclasses.replace(ROWS["K5 1T sp+sel"], recompute=Recompute.NONE)
    got = price(one_t, DEVICE_GEMM[one_t.device])
    assert not got.fits and got.over_bytes > 0 and "activations" in got.reason
    big = dataclasses.replace(ROWS["M 462B"], flash_attention=False)
    assert not price(big, DEVICE_GEMM[big.device]).fits


def test_selective_rows_recompute_the_attention_core() -> None:
    """Table 4's selective row: the layer's backward is the no-recompute backward plus the
    attention core's forward; the Table 5 row's plan charges the same core per block."""
    run = ROWS["K4 selective"]
    gemm = DEVICE_GEMM[run.device]
    base = price(ROWS["K4 baseline"], gemm)
    got = price(run, gemm)
    cm = device_cost_model(profile_for(run, gemm), cluster_for(run), run.optimizer,
                           DeviceGroup(tp_degree=run.t, sequence_parallel=run.sequence_parallel), run.stack)
    core = float(cm.at_batch(run.microbatch).core_ms[1])
    assert core > 0
    assert got.fwd_ms == pytest.approx(base.fwd_ms)
    assert got.bwd_ms == pytest.approx(base.bwd_ms + core)
    t5 = config_plan(ROWS["K5 22B sp+sel"], gemm)
    stage = t5.stages[0]
    assert len(stage.recompute_selective) == 48 and stage.recompute_ms > 0


def test_summary_line(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    rows = ("N1 1.7B", "K4 sel+sp", "M 462B")
    monkeypatch.setattr(sys, "argv", ["published_runs.py", "--no-plan", "--rows", ",".join(rows)])
    assert main() == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"published runs: 3 rows from 3 sources, median \|error\| \d+\.\d%, worst \d+\.\d%, "
                        r"leave-one-source-out (median \d+\.\d% worst \d+\.\d%, mean signed [+-]\d+\.\d%|-, mean signed -), "
                        r"inside band \d/3 \(median width (\d+\.\d%|-)\), fits \d/2, ours faster on -/-", last), last


def test_each_row_is_priced_out_of_source_with_the_fit_that_left_its_source_out() -> None:
    assert DEVICE_GEMM_LOSO, "the leave-one-source-out fits are shipped beside the constants"
    for run in (ROWS["N1 1.7B"], ROWS["M 462B"], ROWS["T L2 13B b2 none"]):
        model = loso_model(run, DEVICE_GEMM_LOSO)
        assert model is not None and f"without {run.publication};" in model.source
        assert not set(model.fitted_on) & set(FIT_ROWS[run.publication])


def test_a_micro_batch_the_source_leaves_out_is_the_faster_that_fits() -> None:
    """The Megatron-LM table gives no micro-batch: each of 1, 2 and 4 is priced and the faster
    that fits in 80 GB is the row's (as the chunks per rank where a source gives none); on M
    32B that is 4 (one micro-batch per replica: the fp32 gradients' reduce-scatter overlaps the
    whole backward), faster than 1 by more than a fifth."""
    run = ROWS["M 32B"]
    options = config_options(run, DEVICE_GEMM[run.device])
    assert sorted(p.microbatch_size for p in options) == [1, 2, 4]
    fitting = [p for p in options if p.predicted.peak_memory_bytes <= usable_bytes(run)]
    assert options[0] is min(fitting, key=lambda p: p.predicted.iteration_ms)
    by_b = {p.microbatch_size: p.predicted.iteration_ms for p in options}
    assert options[0].microbatch_size == 4 and by_b[4] < 0.8 * by_b[1]


def test_the_1t_row_runs_interleaved_in_the_memory_cuda_reports() -> None:
    """Korthikanti's 1T (chunks per rank not given) is priced at the faster of 1 and 2 that fits:
    2 chunks, whose 76.7 GiB fit the 79.14 GiB an A100-SXM4-80GB reports (less 1 GiB outside the
    allocator) but not 80e9 bytes (74.51 GiB), the presets' capacity before; the planner's own
    plan, held to the same memory, is no slower."""
    run = ROWS["K5 1T sp+sel"]
    gemm = DEVICE_GEMM[run.device]
    got = price(run, gemm)
    assert got.fits and got.plan.layout.virtual_stages_per_rank == 2
    assert 80 * 10**9 < got.peak_bytes <= usable_bytes(run) == PRESETS["a100-80gb-x8"].device_memory_bytes - GIB
    ours = own_plan(run, gemm, got)
    assert ours.predicted.iteration_ms <= got.plan.predicted.iteration_ms * (1 + 1e-9)
    assert ours.predicted.peak_memory_bytes <= usable_bytes(run)


def test_own_plan_gets_the_memory_a_configuration_that_does_not_fit_takes() -> None:
    """Table 4's sequence-parallel row (one layer timed; the whole 22B model at that layout needs
    86 GiB): the planner's plan may use as much, and is then no slower. (With zero bubble in the
    default request its plan, ZBV, is faster in less than the usable memory.)"""
    run = ROWS["K4 seq-par"]
    gemm = DEVICE_GEMM[run.device]
    got = price(run, gemm)
    assert not got.fits and usable_bytes(run) < got.peak_bytes
    ours = own_plan(run, gemm, got)
    assert ours.predicted.peak_memory_bytes <= got.peak_bytes
    assert ours.predicted.iteration_ms <= got.plan.predicted.iteration_ms * (1 + 1e-9)


def test_the_tightest_device_is_named_with_its_simulated_peak() -> None:
    """A configuration that does not fit names its tightest pipeline rank with the simulator's peak
    for it (an interleaved rank's chunks peak at different times: their peaks summed are more)."""
    one_t = dataclasses.replace(ROWS["K5 1T sp+sel"], recompute=Recompute.NONE)
    got = price(one_t, DEVICE_GEMM[one_t.device])
    reason = got.reason
    peak = float(re.search(r"simulated peak ([\d.]+) GiB", reason).group(1))
    assert peak == pytest.approx(got.peak_bytes / GIB, abs=0.06)
    lay = got.plan.layout
    summed = max(sum(got.plan.stages[i].memory_total_bytes for i in lay.stage_indices(r)) for r in range(lay.pipeline_size))
    assert lay.virtual_stages_per_rank > 1 and summed / GIB > peak


def test_the_search_reaches_zero_3_over_the_whole_group_where_hsdp_must_recompute() -> None:
    """torchtitan's Llama 2 13B at local batch 2 (FSDP over 64 A100s, no recomputation): ZeRO 1
    does not fit at t = 1, HSDP (shards of 8) fits only by recomputing, and ZeRO 3 over all 64
    fits without; the search solved the whole group only where HSDP did not fit, and its plan was
    2.9% slower than the published layout. Now it finds that layout (or a faster one)."""
    run = ROWS["T L2 13B b2 none"]
    gemm = DEVICE_GEMM[run.device]
    theirs = price(run, gemm)
    assert theirs.fits and not any(s.recompute or s.recompute_selective for s in theirs.plan.stages)
    ours = own_plan(run, gemm, theirs)
    assert ours.predicted.iteration_ms <= theirs.plan.predicted.iteration_ms * (1 + 1e-9)


def test_the_fp8_rows_fit_and_run_as_megatron_bridge_ran_them() -> None:
    """Section 6's FP8 rows: every block in FP8 (the perf scripts turn the bf16 edge blocks off), the
    fused cross entropy, each configuration within the memory CUDA reports; the MoE rows' experts in
    FP8 too, and within memory."""
    import published_fp8

    for run in (r for r in ROWS.values() if r.precision.fp8):
        assert run.bf16_edge_blocks == 0 and run.fused_cross_entropy
        got = price(run, DEVICE_GEMM[run.device])
        assert got.fits, f"{run.label}: {got.peak_bytes / GIB:.2f} GiB: {got.reason}"
        assert got.plan.layout.tp_degree == run.t and got.plan.layout.cp_degree == run.cp
    for moe in published_fp8.MOE_ROWS:
        plan = published_fp8.moe_plan(moe)
        assert plan.predicted.peak_memory_bytes <= published_fp8.pm.usable_bytes()
        assert plan.layout.ep_degree == moe.ep and plan.layout.pipeline_size == moe.pp


def test_the_fp8_block_shapes_carry_a_blocks_linear_flops_on_one_device() -> None:
    """``published_fp8 --shapes``: a block's FP8 GEMMs on one device of each dense FP8 row (forward,
    input and weight gradients) add up to three times its weighted GEMMs' forward FLOPs / (t cp), and
    only the tensor-parallel overlapped rows run them in chunks."""
    import published_fp8

    for run in (r for r in ROWS.values() if r.precision.fp8):
        parts = published_fp8.block_gemm_shapes(run)
        shape = profile_for(run, DEVICE_GEMM[run.device]).layers[1]
        assert shape.fp8 is not None
        weighted = 2.0 * shape.fp8.param_count * run.seq  # 2 FLOPs per weight and token, forward
        assert sum(2.0 * m * n * k for _, _, m, n, k in parts) == pytest.approx(3 * weighted / (run.t * run.cp))
        assert {part[1] for part in parts} == ({1, run.t} if run.t > 1 else {1})
        assert all(0 < published_fp8.wave_fraction(m // chunks, n) <= 1 for _, chunks, m, n, _ in parts)


def test_the_gpt_block_shapes_carry_a_gpt_blocks_linear_flops_on_one_device() -> None:
    """``published_fp8 --waves``: a GPT block's GEMMs on one device (QKV 3h, proj h, fc1 4h, fc2 h wide; forward,
    input and weight gradients) add up to three times its 12 h^2 weights' forward FLOPs / t, chunked as the
    Llama blocks' are."""
    import published_fp8

    gpt = [r for r in ROWS.values() if r.arch != "llama" and r.device == "h100-80gb"]
    assert gpt
    for run in gpt:
        parts = published_fp8.gpt_block_shapes(run)
        tokens = run.seq * run.microbatch // run.cp
        assert sum(2.0 * m * n * k for _, _, m, n, k in parts) == pytest.approx(
            3 * 2.0 * tokens * 12 * run.hidden**2 / run.t)
        assert {part[1] for part in parts} == ({1, run.t} if run.t > 1 and run.stack.tp_overlap_forward else {1})


def test_the_fp8_settings_and_speedup_lines_price_what_they_name(capsys: pytest.CaptureFixture[str]) -> None:
    """``published_fp8 --settings`` prices the 8B row as its source ran it first (its shipped ratio), then with
    one setting undone at a time; ``--speedup`` prices each dense row in bf16 at its layout, slower than in FP8;
    the shipped prices are the same afterwards."""
    import published_fp8

    rows = [r for r in ROWS.values() if r.precision.fp8]
    before = [price(r, DEVICE_GEMM[r.device]).seconds for r in rows]
    published_fp8.settings(rows)
    published_fp8.speedup(rows)
    out = capsys.readouterr().out.splitlines()
    eight = next(r for r in rows if r.t == 1 and r.p == 1)
    first = next(line for line in out if "as the source ran it" in line)
    assert float(first.split()[-2]) == pytest.approx(time_ratio(eight, price(eight, DEVICE_GEMM[eight.device])), abs=5e-4)
    for r in rows:
        line = next(line for line in out if line.startswith(r.label) and "." in line.split()[-1])
        bf16, fp8 = (float(v) for v in line.split()[-5:-3])
        assert bf16 > fp8 == pytest.approx(price(r, DEVICE_GEMM[r.device]).seconds, abs=5e-4)
    assert [price(r, DEVICE_GEMM[r.device]).seconds for r in rows] == before


def test_the_priced_fp8_speedup_holds_against_torchaos_measured_one(capsys: pytest.CaptureFixture[str]) -> None:
    """``published_fp8 --torchao``: torchtitan's Llama 3 8B on 8 H100 (FSDP2, per-op SAC, seq 8,192) priced at bf16
    and at fp8-current; the FP8 speedup the model prices is within 10% of the one torchao's float8 README measured
    (7,689.5 / 6,150 tokens/s, another stack's measurement: nothing is fitted on it), and both plans fit."""
    import published_fp8

    ours, theirs = published_fp8.torchao_check()
    assert theirs == pytest.approx(7689.5 / 6150)
    assert 1.0 < ours and abs(ours / theirs - 1) < 0.10
    out = capsys.readouterr().out
    assert "torchao L3 8B bf16" in out and "torchao L3 8B fp8-current" in out
    for p in (published_fp8.Precision.BF16, published_fp8.Precision.FP8_CURRENT):
        run = published_fp8.torchao_run(p)
        assert run.device == "h100-80gb" and run.d == 8 and run.batch == 8 and run.recompute is Recompute.OPS
        assert price(run, DEVICE_GEMM[run.device]).fits


def test_the_fp8_breakdown_leaves_the_pricing_as_it_found_it(capsys: pytest.CaptureFixture[str]) -> None:
    """``published_fp8 --breakdown`` re-prices each dense row with one term removed at a time (module
    globals and the cluster swapped in turn): every row printed, and the shipped constants, the
    cluster and so each row's price the same afterwards."""
    import published_fp8
    import published_runs

    from planner.artifacts.kinds import Precision
    from planner.cost import precision

    rows = [r for r in ROWS.values() if r.precision.fp8]
    before = [price(r, DEVICE_GEMM[r.device]).seconds for r in rows]
    efficiency, quantise = dict(precision.FP8_GEMM_EFFICIENCY), dict(precision.QUANTISE_BYTES)
    published_fp8.breakdown(rows)
    out = capsys.readouterr().out
    assert all(r.label in out for r in rows)
    assert precision.FP8_GEMM_EFFICIENCY == efficiency and precision.QUANTISE_BYTES == quantise
    assert published_runs.cluster_for is cluster_for and Precision.FP8_CURRENT in precision.QUANTISE_BYTES
    published_runs.profile_for.cache_clear()
    assert [price(r, DEVICE_GEMM[r.device]).seconds for r in rows] == before
