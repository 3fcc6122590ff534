"""Plans are reproduced byte for byte (apart from the planner version): the corpus in
``tests/golden/plans`` was written before the parallel layout was refactored into one
``Layout`` (issue 17); see ``tests/golden_plans.py`` for the cases and how to regenerate.

The selected cases are planned up front in two processes (the suite's machine has two cores and
the cases take 50 s in one); each test compares its own case's text."""

from __future__ import annotations

import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor

import pytest

from tests.golden_plans import CASES, path_of, render

BY_NAME = {c.name: c for c in CASES}


def _param(case):
    marks = [pytest.mark.slow] if case.slow else []
    return pytest.param(case, id=case.name, marks=marks)


def render_named(name: str) -> str:
    return render(BY_NAME[name])


@pytest.fixture(scope="module")
def rendered(request: pytest.FixtureRequest) -> dict[str, str]:
    """The plan text of every case the session selected, by name."""
    names = [item.callspec.params["case"].name for item in request.session.items
             if item.originalname == "test_plan_is_reproduced_byte_for_byte"]
    if len(names) < 2:
        return {}
    spawn = multiprocessing.get_context("spawn")  # not fork: the pytest process may hold torch's threads
    with ProcessPoolExecutor(max_workers=min(2, os.cpu_count() or 1), mp_context=spawn) as pool:
        return dict(zip(names, pool.map(render_named, names)))


@pytest.mark.parametrize("case", [_param(c) for c in CASES])
def test_plan_is_reproduced_byte_for_byte(case, rendered):
    want = path_of(case).read_text()
    got = rendered[case.name] if case.name in rendered else render(case)
    assert got == want, f"plan of case {case.name!r} changed; `python -m tests.golden_plans --diff {case.name}`"
