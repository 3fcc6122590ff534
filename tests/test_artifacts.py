"""Artifacts: round trips, versioning, validation errors that name file, field and value."""

from __future__ import annotations

import json

import pytest

from planner.artifacts import codec
from planner.artifacts.cluster import PRESETS, cluster_from_json, cluster_to_json, load_cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.plan import load_plan, plan_from_json, plan_to_json, save_plan
from planner.artifacts.profile import load_profile, profile_from_json, profile_to_json, save_profile
from planner.artifacts.request import PlanRequest
from planner.profiling.defaults import default_profile
from planner.schemas import render
from planner.solve import plan
from tests.chains import chain_profile, small_cluster


@pytest.fixture(scope="module")
def small_plan():
    prof = chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e6, inp=1e5, out=1e5)] * 4)
    return plan(prof, small_cluster(4), PlanRequest(global_batch=8))


def test_profile_round_trip(tmp_path):
    prof = default_profile()
    path = tmp_path / "p.json"
    save_profile(prof, path)
    again = load_profile(path)
    assert again == prof
    assert path.read_text() == codec.dumps_canonical(profile_to_json(again))


def test_cluster_round_trip_every_preset():
    for cluster in PRESETS.values():
        assert cluster_from_json(json.loads(json.dumps(cluster_to_json(cluster)))) == cluster
        assert cluster.sources, f"preset {cluster.name} has no sources"


def test_plan_round_trip(tmp_path, small_plan):
    path = tmp_path / "plan.json"
    save_plan(small_plan, path)
    assert load_plan(path) == small_plan
    data = json.loads(path.read_text())
    for key in ("schema", "version", "provenance", "num_stages", "dp_degree", "num_microbatches",
                "microbatch_size", "global_batch", "schedule", "stages", "predicted"):
        assert key in data
    for key in ("layer_start", "layer_stop", "layer_names", "ranks", "recompute"):
        assert key in data["stages"][0]
    for key in ("iteration_ms", "throughput_samples_per_s", "peak_memory_bytes", "bubble_fraction", "partition_bound_ms",
                "machine_bound_ms"):
        assert key in data["predicted"]


def test_unknown_version_refused(tmp_path):
    doc = cluster_to_json(PRESETS["local-cpu"])
    doc["version"] = 99
    path = tmp_path / "c.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlannerInputError, match=r"c\.json: version: unsupported planner\.cluster version 99"):
        load_cluster(path)


def test_errors_name_file_field_and_value(tmp_path):
    doc = profile_to_json(chain_profile([dict(fwd=1, bwd=2, params=1, saved=1, inp=1, out=1)] * 2))
    doc["layers"][1]["saved_bytes_per_sample"] = -5.0
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc))
    with pytest.raises(PlannerInputError) as err:
        load_profile(path)
    msg = str(err.value)
    assert "bad.json" in msg and "layers[1]" in msg and "-5.0" in msg and "\n" not in msg


@pytest.mark.parametrize(
    "mutate, fragment",
    [
        (lambda d: d.pop("layers"), "layers: missing required field"),
        (lambda d: d["layers"][0].__setitem__("param_count", "many"), "layers[0].param_count: must be an integer"),
        (lambda d: d["layers"][0]["fwd"].__setitem__("per_sample_ms", -1.0), "per_sample_ms must be >= 0"),
        (lambda d: d.__setitem__("schema", "planner.plan"), "schema: expected 'planner.profile'"),
        (lambda d: d.__setitem__("extra", 1), "extra: unknown field"),
    ],
)
def test_profile_validation_messages(mutate, fragment):
    doc = profile_to_json(chain_profile([dict(fwd=1, bwd=2, params=1, saved=1, inp=1, out=1)] * 2))
    mutate(doc)
    with pytest.raises(PlannerInputError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        profile_from_json(doc, "doc.json")


def test_nan_is_not_json():
    with pytest.raises(PlannerInputError, match="not valid JSON"):
        codec.parse_text('{"a": NaN}', "x.json")


def test_plan_rejects_inconsistent_batch(small_plan):
    doc = plan_to_json(small_plan)
    doc["global_batch"] = doc["global_batch"] + 1
    with pytest.raises(PlannerInputError, match="global_batch"):
        plan_from_json(doc, "p.json")


def test_shipped_schemas_are_current():
    from planner.schemas import HERE

    for fname, text in render().items():
        assert (HERE / fname).read_text() == text, f"{fname} is stale: run python -m planner.schemas"


def test_documents_satisfy_shipped_schemas(small_plan):
    jsonschema = pytest.importorskip("jsonschema")
    from planner.schemas import HERE

    docs = {
        "profile": profile_to_json(default_profile()),
        "cluster": cluster_to_json(PRESETS["a100-80gb-x8"]),
        "plan": plan_to_json(small_plan),
    }
    for name, doc in docs.items():
        schema = json.loads((HERE / f"{name}.v{doc['version']}.schema.json").read_text())
        jsonschema.validate(doc, schema)
        bad = dict(doc, version=doc["version"] + 1)
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, schema)


def test_version_1_plan_is_upgraded(small_plan):
    """A plan written before the bounds were renamed still loads; its bound keeps its meaning."""
    doc = plan_to_json(small_plan)
    pred = dict(doc["predicted"])
    for key in ("machine_bound_ms", "model_flops_per_iteration", "achieved_tflops_per_device", "device_peak_tflops", "mfu"):
        pred.pop(key)
    pred["lower_bound_ms"] = pred.pop("partition_bound_ms")
    old = dict(doc, version=1, predicted=pred)
    old.pop("zero")
    for stage in old["stages"]:
        stage.pop("replicas")
    got = plan_from_json(json.loads(json.dumps(old)))
    assert got.predicted.partition_bound_ms == small_plan.predicted.partition_bound_ms
    assert got.predicted.machine_bound_ms == 0.0 and got.layout.zero == 0


def test_shipped_default_profile_equals_its_formulas():
    from planner.profiling.analytic.gpt import gpt3_profile
    from planner.profiling.defaults import default_profile_path

    assert load_profile(default_profile_path()) == gpt3_profile("gpt3-13b", "a100-80gb")
