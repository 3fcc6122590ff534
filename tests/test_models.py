"""The model zoo and model-spec resolution (planner.models)."""

from __future__ import annotations

import textwrap
import warnings

import pytest
import torch

from planner.artifacts.errors import PlannerInputError
from planner.models import ZOO, load_workload, workload_fingerprint
from planner.models.workload import Workload

SMALL = {
    "gpt": "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64",
    "bert": "bert:layers=2,hidden=32,heads=2,seq=8,vocab=64",
    "vgg": "vgg:convs=4,width=8,image=16",
    "resnet": "resnet:blocks=2,width=8,image=16",
    "moe": "moe:layers=2,hidden=16,heads=2,seq=8,vocab=32,experts=4,topk=2,ffn=24",
}
SMALL["gpt2"] = "gpt2:layers=2,hidden=32,heads=2,seq=8,vocab=64"  # the optional GPT-2 (transformers)
#: every zoo model, the one that needs transformers marked so
NAMES = [pytest.param(n, marks=[pytest.mark.hf] if n == "gpt2" else []) for n in sorted(SMALL)]


def run(workload: Workload, inputs: torch.Tensor) -> torch.Tensor:
    out = inputs
    for layer in workload.layers:
        out = layer(out)
    return out


def test_small_specs_cover_the_zoo() -> None:
    assert set(SMALL) == set(ZOO)


@pytest.mark.parametrize("name", NAMES)
def test_zoo_model_trains_and_is_deterministic(name: str) -> None:
    a, b = load_workload(SMALL[name]), load_workload(SMALL[name])
    assert a.name == name and len(a.layers) == len(a.layer_names) >= 3
    for la, lb in zip(a.layers, b.layers):
        for pa, pb in zip(la.parameters(), lb.parameters()):
            assert torch.equal(pa, pb)
    x, y = a.make_batch(3, seed=7)
    x2, y2 = a.make_batch(3, seed=7)
    assert torch.equal(x, x2) and torch.equal(y, y2)
    assert not torch.equal(a.make_batch(3, seed=8)[0], x)
    loss = a.loss_fn(run(a, x), y)
    assert loss.ndim == 0 and torch.isfinite(loss)
    loss.backward()
    assert all(p.grad is not None for layer in a.layers for p in layer.parameters())
    assert workload_fingerprint(a) == workload_fingerprint(b)


@pytest.mark.parametrize("name", NAMES)
def test_float64_microbatches_match_whole_batch(name: str) -> None:
    """Samples are independent and the loss is a mean: M equal micro-batches = the batch."""
    w = load_workload(SMALL[name], dtype="float64")
    assert all(p.dtype == torch.float64 for layer in w.layers for p in layer.parameters())
    x, y = w.make_batch(4, seed=1)
    whole = w.loss_fn(run(w, x), y)
    assert whole.dtype == torch.float64
    parts = [w.loss_fn(run(w, xm), ym) for xm, ym in zip(x.chunk(2), y.chunk(2))]
    torch.testing.assert_close(sum(parts) / 2, whole, rtol=1e-12, atol=1e-12)


def test_gpt_head_is_tied_to_embedding() -> None:
    w = load_workload("gpt:layers=3,hidden=32,heads=2,seq=8,vocab=64")
    assert w.tied == (((0, "tok.weight"), (4, "proj.weight")),)
    first = dict(w.layers[0].named_parameters())["tok.weight"]
    last = dict(w.layers[-1].named_parameters())["proj.weight"]
    assert first is last


def test_resnet_block_carries_skip_tensor() -> None:
    w = load_workload(SMALL["resnet"])
    x, _ = w.make_batch(2, seed=0)
    stem_out = w.layers[0](x)
    h, skip = w.layers[1](stem_out)
    assert skip is stem_out and h.shape == stem_out.shape


def test_options_change_sizes() -> None:
    w = load_workload("gpt:layers=5,hidden=16,heads=4,seq=4,vocab=32")
    assert len(w.layers) == 7
    assert w.options["hidden"] == 16
    assert load_workload("gpt:layers=5,hidden=16,heads=4,seq=4,vocab=32,seed=1").layers[1] is not None


FACTORY = textwrap.dedent(
    """
    import torch
    from planner.models.workload import Workload

    def good(width=4):
        layer = torch.nn.Linear(width, 2)
        return Workload(name="user", layers=(layer,), layer_names=("fc",),
                        make_batch=lambda b, s: (torch.randn(b, width), torch.zeros(b, dtype=torch.long)),
                        loss_fn=torch.nn.functional.cross_entropy)

    def boom():
        raise RuntimeError("no GPU here\\nsecond line")

    def wrong():
        return torch.nn.Linear(2, 2)

    not_callable = 3
    """
)


@pytest.fixture
def user_module(tmp_path, monkeypatch) -> str:
    (tmp_path / "user_models_for_test.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return "user_models_for_test"


def test_user_factory_with_options(user_module: str) -> None:
    w = load_workload(f"{user_module}:good:width=6")
    assert w.name == "user" and w.layers[0].in_features == 6


@pytest.mark.parametrize(
    "spec, words",
    [
        ("nosuchmodel", "unknown zoo model"),
        ("gpt:depth=3", "unknown option 'depth'"),
        ("gpt:layers=three", "must be an integer"),
        ("gpt:layers", "not key=value"),
        ("gpt:layers=0", "must be >= 1"),
        ("gpt:hidden=30,heads=4", "divisible"),
        ("gpt2:hidden=30,heads=4", "divisible"),
        ("gpt2:depth=1", "unknown option 'depth'"),
        ("gpt:dtype=float16", "dtype must be one of"),
        ("no_such_package_xyz.mod:make", "cannot import"),
        ("{mod}:boom", "factory raised RuntimeError: no GPU here second line"),
        ("{mod}:wrong", "returned Linear, expected planner.Workload"),
        ("{mod}:not_callable", "no callable 'not_callable'"),
        ("{mod}:missing", "no callable 'missing'"),
    ],
)
def test_bad_specs_raise_one_line_input_error(spec: str, words: str, user_module: str) -> None:
    with pytest.raises(PlannerInputError) as info:
        load_workload(spec.format(mod=user_module))
    message = str(info.value)
    assert words in message and "\n" not in message


@pytest.mark.hf
def test_gpt2_from_transformers_matches_the_hf_model() -> None:
    from planner.models.hf_gpt2 import GPT2Options, build_hf_model
    from planner.profiling.measured import profile_model

    spec = "gpt2:layers=2,hidden=32,heads=2,seq=8,vocab=64"
    w = load_workload(spec, dtype="float64")
    assert w.tied == (((0, "wte.weight"), (3, "lm_head.weight")),)
    x, _ = w.make_batch(2, seed=0)
    reference = build_hf_model(GPT2Options(layers=2, hidden=32, heads=2, seq=8, vocab=64, dtype="float64"))
    torch.testing.assert_close(run(w, x), reference(input_ids=x).logits, rtol=0, atol=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profile = profile_model(w, microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, verbose=True)
    untraced = [str(c.message) for c in caught if "cannot be traced" in str(c.message)]
    assert [m.split()[1] for m in untraced] == ["'h0'", "'h1'"]  # GPT2Block: module granularity
    assert profile.metadata["fx_untraced_layers"] == "h0,h1"
    assert profile.tied[0].layers == (0, 3) and profile.model == "gpt2"


def test_gpt_sublayer_granularity_is_the_same_model_cut_finer() -> None:
    spec = "gpt:layers=2,hidden=32,heads=2,seq=8,vocab=64,dtype=float64"
    coarse, fine = load_workload(spec), load_workload(spec + ",granularity=sublayer")
    assert fine.layer_names == ("embed", "block0.attn", "block0.mlp", "block1.attn", "block1.mlp", "head")
    assert fine.tied == (((0, "tok.weight"), (5, "proj.weight")),)
    x, _ = coarse.make_batch(2, seed=3)
    torch.testing.assert_close(run(fine, x), run(coarse, x), rtol=0, atol=0)
    with pytest.raises(PlannerInputError, match="granularity must be"):
        load_workload("gpt:granularity=op")
