"""At least 1,000 hypothesis-generated malformed documents per loader: zero uncaught exceptions."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fuzzing import check_one, mutate, valid_documents

DOCS = valid_documents()


@pytest.mark.parametrize("kind", sorted(DOCS))
@settings(max_examples=1000, deadline=None, database=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_loader_never_crashes(kind, seed):
    valid, loader = DOCS[kind]
    rng = random.Random(seed)
    crash = check_one(mutate(valid, rng), loader, rng)
    assert crash is None, crash


@settings(max_examples=300, deadline=None, database=None)
@given(doc=st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4),
    max_leaves=20,
))
def test_arbitrary_json_never_crashes(doc):
    rng = random.Random(0)
    for valid, loader in DOCS.values():
        if isinstance(doc, dict):
            doc = {**doc, "schema": valid["schema"], "version": 1}
        assert check_one(doc, loader, rng) is None
