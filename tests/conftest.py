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
# One torch thread in this process and in every process a test starts (torchrun launches and the
# notebooks' kernels set it already), unless the caller chose: the models under test are tiny, and
# on a two-core machine shared with other jobs two intra-op threads contend with them. Measured
# at a load average of 6-11: tests/test_hf_models.py, test_profiling.py, test_memory_accuracy.py
# and test_models.py 17-19 s wall, 9-10 s CPU with one thread, 48-94 s wall, 29-38 s CPU with
# torch's default of two; `planner profile ... --repeats 40` (test_first_hour) 10.5 s against 45 s.
os.environ.setdefault("OMP_NUM_THREADS", "1")
if "torch" in sys.modules:  # imported before this file (a plugin): its threads are set already
    sys.modules["torch"].set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


import importlib.util

import pytest
from hypothesis import HealthCheck, settings

# Property tests draw the same examples on every run (seeded by a hash of each test), so that a
# run's verdict is the code's, not the draw's: random draws found two float ties in oracles in
# one session (benchmarks/RESULTS.md section 38), each of which would have failed a landing at
# random. HYPOTHESIS_PROFILE=explore draws new examples on every run (to hunt for such cases).
# No per-example deadline and no "too slow" health check by default: both time the examples in
# wall seconds, which other jobs on a shared machine stretch (hypothesis's 200 ms deadline is a
# load average away from failing any solver example); a test may still set its own.
_UNTIMED = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", derandomize=True, database=None, **_UNTIMED)
settings.register_profile("explore", derandomize=False, **_UNTIMED)
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
