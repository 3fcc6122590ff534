import os
import sys
from pathlib import Path

# The repository's tests/ folder importable (factories for the runtime's spec path).
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("MPLBACKEND", "Agg")


import importlib.util

import pytest

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
