"""The band's model term (``planner.cost.band``, issue 47): the conformal quantile of the errors the
inputs' ranges leave unexplained, so that a figure lies inside the band exactly when its score is
within the term; and ``benchmarks/published_runs.py`` gives each source's rows the term of the
other sources' rows, never their own. Needs no ``../shared``: the rows are in
``benchmarks/published_rows.py``."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.cost.band import BAND_COVERAGE, combine, conformal_quantile, residual_score

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

from published_rows import all_rows
from published_runs import model_errors, outside, price_row, published_time, scores

from planner.profiling.analytic.gemm import DEVICE_GEMM, DEVICE_GEMM_LOSO

fraction = st.floats(0.0, 0.5)


@settings(max_examples=300, deadline=None)
@given(deviation=st.floats(-0.6, 0.6), below=fraction, above=fraction, m=st.floats(0.0, 0.5),
       extra=st.lists(st.tuples(fraction, fraction), max_size=3))
def test_inside_the_band_exactly_when_the_score_is_within_the_model_term(deviation, below, above, m, extra):
    """The score is the band's quadrature run backwards: with the inputs' ranges (any number of
    them, combined as the band combines them) and +-m, the published time t (1 + deviation) lies
    in the band iff the score is at most m."""
    t = 100.0
    ranges = [(t * (1 - lo), t * (1 + hi)) for lo, hi in [(below, above), *extra]]
    lo_in, hi_in = combine(t, ranges)
    lo, hi = combine(t, [*ranges, (t * (1 - m), t * (1 + m))])
    score = residual_score(deviation, (t - lo_in) / t, (hi_in - t) / t)
    pub = t * (1 + deviation)
    if abs(score - m) > 1e-6 and lo > 1e-9:  # away from the edge (and from a band clipped at 0)
        assert (lo <= pub <= hi) == (score <= m)


def test_an_error_the_inputs_allow_scores_nothing_and_the_rest_in_quadrature() -> None:
    assert residual_score(0.05, below=0.01, above=0.06) == 0.0
    assert residual_score(-0.05, below=0.03, above=0.5) == pytest.approx(0.04)  # the side it missed on
    assert residual_score(0.13, below=0.0, above=0.05) == pytest.approx(0.12)


def test_conformal_quantile_is_the_finite_sample_rank() -> None:
    """ceil((n + 1) 0.9)-th smallest: of 19 scores the 18th, of 9 the 9th (the largest), of 3 the
    largest (fewer than 9 promise less than nine in ten)."""
    assert BAND_COVERAGE == 0.9
    assert conformal_quantile([float(i) for i in range(1, 20)]) == 18.0
    assert conformal_quantile([float(i) for i in range(9, 0, -1)]) == 9.0
    assert conformal_quantile([0.3, 0.1, 0.2]) == 0.3
    assert conformal_quantile([0.1, 0.2, 0.3, 0.4], coverage=0.5) == 0.3
    with pytest.raises(ValueError, match="at least one"):
        conformal_quantile([])


def test_each_source_takes_the_model_term_of_the_other_sources_rows() -> None:
    """Rows of three sources priced out of source: a source's term is the conformal quantile of
    the other sources' scores, and moving one source's published figure far off changes the
    others' terms but not its own; the row is then reported outside its band, with its terms."""
    wanted = ("N1 1.7B", "N6 76.1B", "K5 175B full", "K5 22B sp+sel", "T L2 13B b2 none", "T L3 70B b1 full")
    rows = [r for r in all_rows() if r.label in wanted]
    results = [price_row(r, dict(DEVICE_GEMM), dict(DEVICE_GEMM_LOSO), plans=False) for r in rows]
    scored = scores(rows, results)
    assert len(scored) == len(rows) and all(s >= 0 for _, s in scored)
    terms = model_errors(rows, results)
    for src, term in terms.items():
        assert term == conformal_quantile([s for other, s in scored if other != src])

    far = [dataclasses.replace(r, published=r.published * 0.5) if r.label == "N1 1.7B" else r for r in rows]
    moved = model_errors(far, results)
    assert moved["Narayanan et al. 2021"] == terms["Narayanan et al. 2021"]
    assert all(moved[s] > terms[s] for s in moved if s != "Narayanan et al. 2021")
    run, res = far[0], results[0].with_model_error(moved[far[0].publication])
    assert published_time(run) > res.band[1]
    why = outside(run, res)
    assert why.startswith("N1 1.7B: published +") and "(above: " in why and "model term" in why
    k175 = next(i for i, r in enumerate(rows) if r.label == "K5 175B full")  # out of source within 2%
    held = results[k175].with_model_error(terms[rows[k175].publication])
    lo, hi = held.band
    assert lo <= published_time(rows[k175]) <= hi and outside(rows[k175], held) == ""


def test_a_rows_band_takes_the_gemm_spread_only_from_fits_that_never_saw_its_source() -> None:
    """Every leave-one-source-out fit but one was fitted on rows of a bf16 source: a row of that
    source takes only the fit that left it out, its own prediction's, so no GEMM range (in-source
    fits would pull its band toward its own published figure); the FP8 rows, a source no fit has
    seen, take every fit's spread. The plan a user prices still takes every fit (none saw it)."""
    from published_runs import GEMM_INPUT, unseen_fits

    loso = dict(DEVICE_GEMM_LOSO)
    rows = {r.label: r for r in all_rows() if r.label in ("N1 1.7B", "K4 baseline", "MB L3 8B fp8")}
    for label in ("N1 1.7B", "K4 baseline"):
        run = rows[label]
        (fit,) = unseen_fits(run, loso)
        assert f"without {run.publication};" in fit.source
        res = price_row(run, dict(DEVICE_GEMM), loso, plans=False)
        gemm = [r for n, r in zip(res.range_names, res.ranges) if n == GEMM_INPUT]
        assert all(lo == hi == res.out.seconds for lo, hi in gemm)  # none, or the prediction itself
    assert GEMM_INPUT not in price_row(rows["N1 1.7B"], dict(DEVICE_GEMM), loso, plans=False).range_names
    fp8 = rows["MB L3 8B fp8"]
    assert len(unseen_fits(fp8, loso)) == len(loso[fp8.device]) > 1
    res = price_row(fp8, dict(DEVICE_GEMM), loso, plans=False)
    lo, hi = dict(zip(res.range_names, res.ranges))[GEMM_INPUT]
    assert lo < res.out.seconds < hi


def test_scores_are_printed_by_source_largest_first_with_the_rank_the_quantile_takes() -> None:
    from published_runs import score_lines

    rows = [r for r in all_rows() if r.label in ("K4 baseline", "K4 seq-par", "K4 sel+sp", "N1 1.7B")]
    results = [price_row(r, dict(DEVICE_GEMM), dict(DEVICE_GEMM_LOSO), plans=False) for r in rows]
    lines = score_lines(rows, results)
    assert [line.split(":")[0] for line in lines] == [
        "scores, Narayanan et al. 2021", "scores, Korthikanti et al. 2022", "scores, every source"]
    korthikanti = lines[1].split(": ", 1)[1]
    shown = [float(part.split(" (")[0].rsplit(" ", 1)[1]) for part in korthikanti.split("), ")]
    assert len(shown) == 3 and shown == sorted(shown, reverse=True)
    every = sorted((s for _, s in scores(rows, results)), reverse=True)
    # fewer than nine scores: the quantile is the largest
    assert lines[-1].endswith(f"number 1 of 4 from the largest, {100 * every[0]:.1f}%")
