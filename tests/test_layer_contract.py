"""The layer contract checked at profile time, and the public API's documentation (issue 13,
items 3 and 7). A layer output that cannot cross a stage boundary is refused by ``planner
profile`` with the layer and the tensor named, before anything is measured; a non-contiguous
boundary tensor is accepted (the runtime sends a contiguous copy: its run against one process
is in tests/test_runtime_numerics.py, ``transposed-P2-D1-gpipe``)."""

from __future__ import annotations

import dataclasses
import json
import pydoc
import subprocess
import sys
from pathlib import Path

import pytest

from planner.commands.cli import main as planner_main
from planner.models import load_workload
from planner.profiling.measured.contract import check_layer_contract

REFUSED = {  # factory -> what the one-line refusal must say
    "returns_dict": "layer 'block_1' returns a dict (keys: last_hidden_state, hidden_states): "
    "a layer must return a tensor or a tuple of tensors",
    "returns_model_output": "layer 'block_1' returns a BaseModelOutput (a dict) (keys: last_hidden_state)",
    "returns_list": "layer 'block_1' returns a list of 2 (use a tuple)",
    "returns_nested": "layer 'block_1' returns a tuple whose element 1 is a tuple of 2 (tuples are not nested",
    "returns_none_in_tuple": "layer 'block_1' returns a tuple whose element 1 is None",
    "returns_complex": "layer 'block_1' returns a tensor of dtype complex64 [1, 8], which gloo and NCCL cannot send",
}


@pytest.mark.parametrize(
    "factory", [pytest.param(f, marks=[pytest.mark.hf] if f == "returns_model_output" else []) for f in sorted(REFUSED)]
)
def test_profile_refuses_a_layer_that_breaks_the_contract(
    factory: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "p.json"
    args = ["profile", "--model", f"tests.contract_factories:{factory}", "--microbatch-sizes", "1,2"]
    code = planner_main([*args, "--warmup", "0", "--repeats", "1", "--no-progress", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1 and REFUSED[factory] in err, err
    assert not out.exists()


def test_a_non_contiguous_boundary_tensor_and_a_sum_count_loss_profile(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for factory in ("transposed", "padded_lm"):
        out = tmp_path / f"{factory}.json"
        args = ["profile", "--model", f"tests.contract_factories:{factory}", "--microbatch-sizes", "1,2"]
        assert planner_main([*args, "--warmup", "0", "--repeats", "1", "--no-progress", "--out", str(out)]) == 0
        profile = json.loads(out.read_text())
        assert [layer["name"] for layer in profile["layers"]][-1] == "head" and len(profile["layers"]) == 5
    capsys.readouterr()


def test_the_zoo_keeps_the_contract() -> None:
    """No false refusal: the zoo models (gpt2 aside: building it imports transformers for seconds) and the
    runtime tests' factories pass the check."""
    specs = [
        "gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32",
        "gpt:layers=2,hidden=16,heads=2,seq=4,vocab=32,granularity=sublayer",
        "bert:layers=2,hidden=16,heads=2,seq=4,vocab=32",
        "vgg:convs=2,width=4,image=8,classes=4",
        "resnet:blocks=2,width=4,image=8,classes=4",
        "tests.factories:mlp",
        "tests.factories:skip",
        "tests.factories:tiny_gpt",
    ]
    for spec in specs:
        workload = load_workload(spec)
        check_layer_contract(workload, *workload.make_batch(2, 0))


def test_a_bad_loss_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    from planner.artifacts.errors import PlannerInputError

    workload = load_workload("tests.factories:mlp")
    per_sample = dataclasses.replace(workload, loss_fn=lambda out, target: ((out - target) ** 2).mean(dim=1))
    want = r"loss_fn must return a scalar tensor \(the mean loss\) or \(sum, count\); it is a Tensor \[2\]"
    with pytest.raises(PlannerInputError, match=want):
        check_layer_contract(per_sample, *per_sample.make_batch(2, 0))
    triple = dataclasses.replace(workload, loss_fn=lambda out, target: (out.sum(), 1, 2))
    with pytest.raises(PlannerInputError, match="loss_fn returned a tuple of 3"):
        check_layer_contract(triple, *triple.make_batch(2, 0))


def test_help_documents_every_workload_field() -> None:
    import planner

    text = pydoc.render_doc(planner.Workload, renderer=pydoc.plaintext)
    for f in dataclasses.fields(planner.Workload):
        assert f"``{f.name}``:" in text, f"help(planner.Workload) does not document {f.name!r}"
    assert "(sum, count)" in text


def test_dir_lists_the_public_api_with_the_lazy_imports() -> None:
    """In a fresh interpreter: the lazily imported names are listed before anything imports them."""
    code = "import json, planner; print(json.dumps([dir(planner), planner.__all__]))"
    names, public = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert set(public) <= set(names)
    assert {"Workload", "plan", "profile_model", "load_workload", "compare", "PlanRequest"} <= set(names)
