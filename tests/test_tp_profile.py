"""The profile side of tensor parallelism for measured zoo transformers: ``Layer.tp`` is
declared from the blocks' own modules (``planner.profiling.measured.tensor_split``) and agrees with the
blocks run sharded over t = 2 gloo ranks (tests/tp_profile_driver.py): per-rank parameters
and saved bytes exactly as declared without sequence parallelism; with it, the documented
difference (the column-split linears keep their gathered inputs whole)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.models import load_workload
from planner.profiling.measured.profiler import profile_model
from tests.runtime_launch import torchrun

SPECS = [
    "gpt:layers=1,hidden=32,heads=4,seq=8,vocab=64",
    "bert:layers=1,hidden=32,heads=4,seq=8,vocab=64",
    "gpt:layers=1,hidden=32,heads=4,seq=8,vocab=64,granularity=sublayer",
]
T = 2


def test_profile_declares_the_zoo_split() -> None:
    h, s = 32, 8
    profile = profile_model(load_workload(SPECS[0]), microbatch_sizes=(1,), warmup=0, repeats=1, progress=False)
    embed, block, head = profile.layers
    assert embed.tp is None and head.tp is None  # the runtime keeps them whole (head tied to the embedding)
    split = block.tp
    assert split is not None
    assert split.must_divide == (4,)
    assert split.split_param_count == 12 * h * h + 7 * h  # q, k, v, fc weights + biases; proj, out weights
    assert block.param_count - split.split_param_count == 6 * h  # two layer norms, two row-split biases
    assert split.split_time_fraction == 1.0  # every FLOP of the block is in the split attention and MLP
    assert split.collectives_fwd == split.collectives_bwd == 2
    assert split.collective_bytes_per_sample == block.output_bytes_per_sample == 4 * s * h
    # float32, CPU fused attention, once per storage: q, k, v, the output (at micro-batch 1 the
    # proj input is a view of it: one storage) (4 s h), GeLU input and out input (8 s h), and the
    # attention's log-sum-exp (4 a s bytes)
    assert split.split_saved_bytes_per_sample == 4 * 12 * s * h + 4 * 4 * s
    # the rest: two layer-norm inputs, the q, k, v input (saved by each of them: one storage),
    # the fc input (4 s h) + norm stats
    assert block.saved_bytes_per_sample - split.split_saved_bytes_per_sample == 4 * 4 * s * h + 4 * 4 * s


@pytest.mark.slow
def test_sharded_blocks_match_the_declaration(tmp_path: Path) -> None:
    (tmp_path / "specs.json").write_text(json.dumps(SPECS))
    proc = torchrun(T, ["tests/tp_profile_driver.py", str(tmp_path / "specs.json"), str(tmp_path / "out.json")])
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads((tmp_path / "out.json").read_text())
    assert len(rows) == 2 * 4  # (gpt block, bert block, gpt attn, gpt mlp) x (sp off, on)
    for row in rows:
        saved, split, cols = row["saved_bytes"], row["split_saved_bytes"], row["column_input_bytes"]
        params, split_params = row["param_count"], row["split_param_count"]
        assert 0 < split < saved and 0 < split_params < params
        assert row["measured_param_count"] == [params - split_params + split_params // T] * T, row
        if row["sequence_parallel"]:
            expected = saved // T + cols - cols // T  # the declaration says saved / T
        else:
            expected = saved - split + split // T  # exactly the declaration
        assert row["measured_saved_bytes"] == [expected] * T, row
