"""Malformed-document generators shared by the fuzz test and benchmarks/fuzz_loaders.py."""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Callable
from typing import Any

from planner.artifacts.cluster import PRESETS, cluster_from_json, cluster_to_json
from planner.artifacts.codec import parse_text
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.plan import plan_from_json, plan_to_json
from planner.artifacts.profile import profile_from_json, profile_to_json
from planner.artifacts.request import PlanRequest

JUNK: list[Any] = [None, True, False, 0, -1, 1, 2**70, -1e308, 1e308, 0.5, "", "x", "NaN", [], {}, [1, 2], {"a": 1},
                   "planner.profile", "planner.plan", 1.0, -0.0]


def valid_documents() -> dict[str, tuple[dict, Callable[[Any, str], Any]]]:
    from planner.solve import plan
    from tests.chains import chain_profile, small_cluster

    prof = chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e6, inp=1e5, out=1e5)] * 3)
    pl = plan(prof, small_cluster(2), PlanRequest(global_batch=4))
    return {
        "profile": (profile_to_json(prof), profile_from_json),
        "cluster": (cluster_to_json(PRESETS["a100-80gb-2x8"]), cluster_from_json),
        "plan": (plan_to_json(pl), plan_from_json),
    }


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, prefix + (i,))
    return out


def mutate(doc: dict, rng: random.Random) -> Any:
    """One to three random corruptions of a valid document."""
    doc = copy.deepcopy(doc)
    for _ in range(rng.randint(1, 3)):
        paths = [p for p in _paths(doc) if p]
        if not paths or rng.random() < 0.05:
            return rng.choice(JUNK)
        path = rng.choice(paths)
        parent = doc
        for key in path[:-1]:
            parent = parent[key]
        key = path[-1]
        op = rng.random()
        if op < 0.3 and isinstance(parent, dict):
            del parent[key]
        elif op < 0.4 and isinstance(parent, list):
            parent.pop(key)
        elif op < 0.5 and isinstance(parent, dict):
            parent[rng.choice(["extra", "🙂", "", "a\nb", "x.y", "\x00"])] = rng.choice(JUNK)
        elif op < 0.6 and isinstance(parent[key], (int, float)) and not isinstance(parent[key], bool):
            parent[key] = parent[key] * rng.choice([-1, 0, 1e300, 0.5, -1e-9])
        else:
            parent[key] = copy.deepcopy(rng.choice(JUNK))
    return doc


def load_text(text: str, loader: Callable[[Any, str], Any]) -> None:
    loader(parse_text(text, "fuzz.json"), "fuzz.json")


def check_one(doc: Any, loader: Callable[[Any, str], Any], rng: random.Random) -> str | None:
    """Load a corrupted document (as data, or as mangled text); return a crash description."""
    try:
        if rng.random() < 0.2:
            text = json.dumps(doc)
            cut = rng.randint(0, len(text))
            text = text[:cut] + rng.choice(["", "}", "]", ",", "\x00", "NaN", "Infinity", '"']) + text[cut:]
            load_text(text, loader)
        else:
            loader(doc, "fuzz.json")
    except PlannerInputError as exc:
        if "\n" in str(exc):
            return f"multi-line message: {exc!r}"
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None
