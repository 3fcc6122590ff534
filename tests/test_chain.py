"""planner.models.chain: layers with skip connections carried for you (the U-Net of its docstring)."""

from __future__ import annotations

import re
import textwrap

import pytest
import torch

import planner.models.skips as skips_module
from planner.artifacts.errors import PlannerInputError
from planner.models import chain
from planner.models.workload import Workload
from planner.profiling.measured import profile_model
from planner.profiling.measured.contract import check_layer_contract


def _docstring_unet() -> Workload:
    """Run the U-Net example of the module docstring as written; return its workload."""
    block = re.search(r"in 15 lines::\n\n(.*?)\n\nRules", skips_module.__doc__ or "", re.S)
    assert block, "the docstring's example"
    code = textwrap.dedent(block.group(1))
    assert len(code.strip().splitlines()) <= 17  # the imports and the 15 lines it promises
    namespace: dict[str, object] = {}
    exec(compile(code, "skips docstring", "exec"), namespace)
    unet = namespace["unet"]
    assert isinstance(unet, Workload)
    return unet


def test_docstring_unet_equals_the_model_written_out() -> None:
    torch.manual_seed(0)
    unet = _docstring_unet()
    x, _ = unet.make_batch(2, 0)
    m = [layer.module for layer in unet.layers]
    e0 = m[0](x)
    e1 = m[1](e0)
    mid = m[2](e1)
    d1 = m[3](mid, e1)
    d0 = m[4](d1, e0)
    expected = m[5](d0)
    out = x
    for layer in unet.layers:
        out = layer(out)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)
    check_layer_contract(unet, *unet.make_batch(2, 0))


def test_boundaries_carry_exactly_the_skips_still_needed() -> None:
    unet = _docstring_unet()
    out = unet.make_batch(1, 0)[0]
    widths = []
    for layer in unet.layers[:-1]:
        out = layer(out)
        widths.append(len(out) if isinstance(out, tuple) else 1)
    # after enc0: (enc0, enc0 for dec0); after enc1: (enc1, enc0, enc1); after mid: (mid, enc0, enc1);
    # after dec1: (dec1, enc0); after dec0: dec0
    assert widths == [2, 3, 3, 2, 1]


def test_profile_records_the_skip_bytes_crossing_each_cut() -> None:
    unet = _docstring_unet()
    profile = profile_model(unet, microbatch_sizes=(1, 2), warmup=0, repeats=1, progress=False, trace_ops=False)
    assert profile.layer_names == ("enc0", "enc1", "mid", "dec1", "dec0", "out")
    # the encoder-0 features (8 x 16 x 16 float32 per sample) cross every cut from enc0 to dec0
    crossing = {(e.src, e.dst) for e in profile.edges}
    assert (0, 4) in crossing and (1, 3) in crossing


@pytest.mark.parametrize(
    "skips, message",
    [([(2, 1)], "must go forward"), ([(0, 9)], "must go forward"), ([(0, 2), (0, 2)], "given twice"), ([(0,)], "a pair")],
)
def test_bad_skips_are_refused(skips: list[tuple[int, ...]], message: str) -> None:
    with pytest.raises(PlannerInputError, match=message):
        chain([torch.nn.Identity()] * 3, skips=skips)  # type: ignore[arg-type]
