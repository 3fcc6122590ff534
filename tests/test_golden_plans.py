"""Plans are reproduced byte for byte (apart from the planner version): the corpus in
``tests/golden/plans`` was written before the parallel layout was refactored into one
``Layout`` (issue 17); see ``tests/golden_plans.py`` for the cases and how to regenerate."""

from __future__ import annotations

import pytest

from tests.golden_plans import CASES, PIPEDREAM_DIR, path_of, render


def _param(case):
    marks = [pytest.mark.slow] if case.slow else []
    return pytest.param(case, id=case.name, marks=marks)


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_plan_is_reproduced_byte_for_byte(case):
    if case.needs_reference and not PIPEDREAM_DIR.exists():
        pytest.skip(f"PipeDream's profiles are not at {PIPEDREAM_DIR}")
    want = path_of(case).read_text()
    got = render(case)
    assert got == want, f"plan of case {case.name!r} changed; `python -m tests.golden_plans --diff {case.name}`"
