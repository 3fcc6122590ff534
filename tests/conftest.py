import os
import sys
from pathlib import Path

# The repository's tests/ folder importable (factories for the runtime's spec path).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")
# No progress lines in the suite (they would sit beside the one-line refusals the tests read, as
# soon as a loaded machine makes a check last over two seconds); the tests of progress itself
# (test_first_hour.py) turn it on for their own commands.
os.environ.setdefault("PLANNER_PROGRESS", "0")


import importlib.util

import pytest
from hypothesis import settings

# Property tests draw the same examples on every run (seeded by a hash of each test), so that a
# run's verdict is the code's, not the draw's: random draws found two float ties in oracles in
# one session (benchmarks/RESULTS.md section 38), each of which would have failed a landing at
# random. HYPOTHESIS_PROFILE=explore draws new examples on every run (to hunt for such cases).
settings.register_profile("ci", derandomize=True, database=None)
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

from tests.runtime_launch import SharedLaunches

HAS_TRANSFORMERS = importlib.util.find_spec("transformers") is not None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked ``hf`` need the optional ``transformers``: without it they are skipped,
    saying so (CI installs the ``hf`` extra and runs them)."""
    if HAS_TRANSFORMERS:
        return
    skip = pytest.mark.skip(reason="needs transformers: pip install -e '.[hf]' (CI installs it and runs these)")
    for item in items:
        if "hf" in item.keywords:
            item.add_marker(skip)


LAUNCHES = pytest.StashKey[SharedLaunches]()


def pytest_collection_finish(session: pytest.Session) -> None:
    """Plan the runtime driver's launches: every configuration of the selected (not skipped)
    tests marked ``driver``, by world size (:class:`tests.runtime_launch.SharedLaunches`)."""
    launches = session.config.stash[LAUNCHES] = SharedLaunches()
    for item in session.items:
        marker = item.get_closest_marker("driver")
        if marker is None or item.get_closest_marker("skip") is not None:
            continue
        world = marker.kwargs.get("world") or item.callspec.params["world"]  # type: ignore[attr-defined]
        launches.plan(world, marker.kwargs["configs"](world))


@pytest.fixture(scope="session")
def driven(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> SharedLaunches:
    """The session's runtime driver launches (one per world size, shared by the tests marked ``driver``)."""
    launches = request.config.stash.get(LAUNCHES, None) or SharedLaunches()
    launches.folder = tmp_path_factory.mktemp("driver")
    return launches
