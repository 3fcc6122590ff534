"""Saved bytes three ways, on real models at micro-batch 1, 2 and 4: the runtime's hook count
(once per storage, ``planner.runtime.memory.SavedBytesMeter``) against the allocator's own
accounting (``torch.profiler`` memory events) of the same storages, and the profile's
prediction (fitted ``a + b x micro-batch``, storages two layers share counted once) against
the hook count. Each model runs as two pipeline stages in one process, as the runtime runs a
micro-batch: the stage modules, the meter, the probe, a received copy of the boundary tensors.

Models: the zoo GPT and BERT, Hugging Face Llama and Qwen2, and a small U-Net (encoder levels
concatenated into the decoder: skips over three layers, storages two layers share)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from planner.artifacts.cluster import PRESETS
from planner.cost import CostModel
from planner.models import load_workload
from planner.models.selective import set_selective
from planner.models.workload import Workload
from planner.profiling.measured import profile_model
from planner.runtime.memory import AllocatorProbe
from planner.runtime.stage import StageModule
from tests.factories import unet

SIZES = (1, 2, 4)
TOLERANCE = 0.05
MODELS = {
    "zoo-gpt": "gpt:layers=2,hidden=64,heads=4,seq=32,vocab=256",
    "zoo-bert": "bert:layers=2,hidden=64,heads=4,seq=32,vocab=256",
    "hf-llama": "hf:llama:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256,seq=32",
    "hf-qwen2": "hf:qwen2:layers=2,hidden=64,heads=4,kv_heads=2,intermediate=128,vocab=256,seq=32",
    "unet": "",
}


def _workload(name: str) -> Workload:
    return unet() if name == "unet" else load_workload(MODELS[name])


def _args(value: Any) -> tuple[Any, ...]:
    return value if isinstance(value, tuple) else (value,)


def run_two_stages(work: Workload, cut: int, b: int, selective: bool = False) -> list[StageModule]:
    """One micro-batch of ``b`` through stages ``[0, cut)`` and ``[cut, L)`` (the second with
    the loss), metered and probed; the second stage receives a copy of the boundary tensors."""
    n = len(work.layers)
    mods = [StageModule(list(work.layers[a:z]), [False] * (z - a), [selective] * (z - a)) for a, z in ((0, cut), (cut, n))]
    probe = AllocatorProbe(torch.device("cpu"))
    inputs, targets = work.make_batch(b, 0)
    kept = []
    with probe.session():
        for m in mods:
            m.probe = probe
        out0 = mods[0](*_args(inputs))
        received = tuple(t.detach().clone().requires_grad_(t.is_floating_point()) for t in _args(out0))
        out1 = mods[1](*received)
        with mods[1].measured((out1, targets), merge=True) as box:
            box.append(work.loss_fn(out1, targets))
        kept += [out0, received, out1, box]
    for m in mods:
        m.read_allocator()
        m.probe = None
    for m in mods:  # back to no recomputation: the layers are shared with the profile
        for layer in m.layers:
            set_selective(layer, False)
    return mods


@pytest.fixture(
    scope="module", params=[pytest.param(n, marks=[pytest.mark.hf] if n.startswith("hf") else []) for n in MODELS],
    ids=list(MODELS),
)
def profiled(request: pytest.FixtureRequest) -> tuple[str, Workload, CostModel]:
    name = request.param
    if name.startswith("hf"):
        pytest.importorskip("transformers")
    work = _workload(name)
    profile = profile_model(work, microbatch_sizes=SIZES, warmup=0, repeats=1, progress=False, trace_ops=False)
    return name, work, CostModel(profile, PRESETS["local-cpu"])


@pytest.mark.parametrize("b", SIZES)
def test_hooks_match_the_allocator_and_the_profile_predicts_them(profiled: tuple[str, Workload, CostModel], b: int) -> None:
    name, work, cm = profiled
    cut = cm.num_layers // 2
    mods = run_two_stages(work, cut, b)
    for m, (start, stop) in zip(mods, ((0, cut), (cut, cm.num_layers))):
        (record,) = m.records
        assert record.allocated_bytes > 0, name
        hook_vs_alloc = (record.new_saved_bytes - record.allocated_bytes) / record.allocated_bytes
        assert abs(hook_vs_alloc) <= TOLERANCE, (name, b, start, record)
        predicted = cm.activation_bytes(start, stop, (), b)
        assert abs(record.saved_bytes - predicted) <= TOLERANCE * predicted, (name, b, start, record.saved_bytes, predicted)


def test_selective_level_is_predicted(profiled: tuple[str, Workload, CostModel]) -> None:
    """With every attention core recomputed, the stages keep what the profile's selective
    level says (within 5%), and less than without; a model without attention cores (the U-Net)
    keeps exactly what it keeps without the selective level."""
    name, work, cm = profiled
    cut, b = cm.num_layers // 2, 2
    plain = [m.records[0].saved_bytes for m in run_two_stages(work, cut, b)]
    for m, (start, stop), before in zip(run_two_stages(work, cut, b, selective=True), ((0, cut), (cut, cm.num_layers)), plain):
        sel = [i for i in range(start, stop) if cm.has_core[i]]
        predicted = cm.activation_bytes(start, stop, (), b, sel)
        got = m.records[0].saved_bytes
        assert abs(got - predicted) <= TOLERANCE * predicted, (name, start, got, predicted)
        assert got < before if sel else got == before
