"""Context parallelism (issue 20, the runtime side): the load-balanced split of a sequence, the
batch split, and what is refused before any compute.

The numerics (cp = 2 against one process, float64) and the activation bytes per rank run in
tests/test_runtime_context.py's launches.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.layout import Layout
from planner.artifacts.plan import plan_to_json
from planner.models import load_workload
from planner.models.context import SequenceShard, context_of, set_context
from planner.runtime.check import check_plan
from planner.runtime.context import split_batch
from planner.runtime.topology import RankPosition, _grad_lines, mesh_ranks
from tests.factories import make_plan

GPT = "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32"
LLAMA = "hf:llama:layers=2,hidden=16,heads=4,kv_heads=2,intermediate=32,vocab=32,seq=8,padding=1"


@pytest.mark.parametrize("cp", [1, 2, 3, 4])
def test_split_is_load_balanced_and_covers_the_sequence(cp: int) -> None:
    """Rank i holds chunks i and 2cp - 1 - i: the ranks' positions are the sequence once each,
    every rank attends to the same number of (query, key) pairs under the causal mask, and the
    gathered keys' positions are the ranks' in rank order."""
    seq = 4 * cp * 3
    shards = [SequenceShard(degree=cp, index=i) for i in range(cp)]
    local = seq // cp
    positions = [s.positions(local) for s in shards]
    assert sorted(torch.cat(positions).tolist()) == list(range(seq))
    keys = shards[0].key_positions(local)
    assert keys.tolist() == torch.cat(positions).tolist()
    pairs = {int(s.causal_mask(p, keys).sum()) for s, p in zip(shards, positions)}
    assert pairs == {seq * (seq + 1) // 2 // cp}  # the causal triangle, split evenly
    tokens = torch.arange(seq).repeat(2, 1)
    for s, p in zip(shards, positions):
        assert torch.equal(s.split(tokens, dim=1), p.repeat(2, 1))  # the split takes the positions' tokens
    assert shards[0].causal_mask(positions[0], keys, window=3).sum(dim=1).max() <= 3


def test_split_chunks_literally() -> None:
    """cp = 2 over 8 tokens: chunks of 2; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2."""
    assert SequenceShard(degree=2, index=0).positions(4).tolist() == [0, 1, 6, 7]
    assert SequenceShard(degree=2, index=1).positions(4).tolist() == [2, 3, 4, 5]
    assert SequenceShard(degree=2, index=1).key_positions(4).tolist() == [0, 1, 6, 7, 2, 3, 4, 5]


def test_a_sequence_2cp_does_not_divide_is_refused() -> None:
    with pytest.raises(ValueError, match="cuts a sequence into 4 chunks: 6 tokens per sample do not divide"):
        SequenceShard(degree=2, index=0).split(torch.zeros(1, 6))
    with pytest.raises(ValueError, match="cp index 2 is not one of 2"):
        SequenceShard(degree=2, index=2)
    assert load_workload(GPT).context_parallel.refusal(3) == (
        "context parallelism over 3 ranks cuts each sequence into 6 chunks: the model's 8 tokens per sample do not divide"
    )


def test_batches_split_the_tokens_and_keep_the_padding_mask_whole() -> None:
    shard = SequenceShard(degree=2, index=1)
    gpt = load_workload(GPT)
    tokens, targets = gpt.make_batch(2, 0)
    got_in, got_t = split_batch(tokens, targets, gpt, shard)
    assert torch.equal(got_in, tokens[:, 2:6]) and torch.equal(got_t, targets[:, 2:6])
    llama = load_workload(LLAMA)
    (ids, pad), labels = llama.make_batch(2, 0)
    (got_ids, got_pad), got_labels = split_batch((ids, pad), labels, llama, shard)
    assert torch.equal(got_ids, ids[:, 2:6]) and got_pad is pad and torch.equal(got_labels, labels[:, 2:6])


def test_models_declare_their_sequence_split() -> None:
    assert load_workload(GPT).context_parallel is not None
    assert load_workload(LLAMA).context_parallel.whole_inputs == (1,)
    assert load_workload("bert:layers=2,hidden=16,heads=2,seq=8,vocab=32").context_parallel is None
    assert load_workload("hf:gpt2:layers=2,hidden=16,heads=4,vocab=32,seq=8,n_positions=8").context_parallel is None


def test_a_layer_learns_its_shard_and_positions_follow_it() -> None:
    """The zoo embedding adds the position embeddings of the global positions of its tokens."""
    gpt = load_workload(GPT)
    embed = gpt.layers[0]
    tokens, _ = gpt.make_batch(1, 0)
    whole = embed(tokens)
    shard = SequenceShard(degree=2, index=0)
    set_context(embed, shard)
    assert context_of(embed.pos) is shard
    assert torch.equal(embed(shard.split(tokens)), shard.split(whole))
    set_context(embed, None)
    assert context_of(embed) is None


def test_plans_the_runtime_cannot_split_are_refused_before_compute() -> None:
    """``check_plan`` (each rank's, and ``planner run``'s before torchrun starts): one line naming
    the field and the value."""
    gpt = load_workload(GPT)
    names = gpt.layer_names
    check_plan(make_plan(names, (2,), cp_degree=2, tp_degree=2, zero=1, dp_degree=2), gpt, 16)  # runs
    with pytest.raises(PlannerInputError, match="plan: context parallelism over 3 ranks cuts each sequence into 6 chunks"):
        check_plan(make_plan(names, (), cp_degree=3), gpt, 3)
    mlp = load_workload("tests.factories:mlp")
    with pytest.raises(PlannerInputError, match="cp_degree 2: model 'mlp' declares no context-parallel split"):
        check_plan(make_plan(mlp.layer_names, (), cp_degree=2), mlp, 2)
    with pytest.raises(PlannerInputError, match="cp_degree 2 with sequence parallelism: both cut the sequence"):
        check_plan(make_plan(names, (), cp_degree=2, tp_degree=2, sequence_parallel=True), gpt, 4)
    with pytest.raises(PlannerInputError, match=r"plan needs 4 processes \(2 stages x 1 replicas x cp 2\)"):
        check_plan(make_plan(names, (2,), cp_degree=2), gpt, 2)


def test_ranks_and_groups_follow_the_layout() -> None:
    """The (P, D, c, t) mesh is arange(world) in row-major order; a rank's gradient group is its
    stage's D x c ranks at its tp index (``Layout.grad_group``), its cp group the c ranks of its
    replica (``Layout.cp_group``), and its checkpoint slot its place in the gradient group."""
    layout = Layout(num_stages=2, dp_degree=2, cp_degree=2, tp_degree=2)
    mesh = np.arange(16).reshape(2, 2, 2, 2)
    assert mesh_ranks(layout).tolist() == mesh.tolist()
    grads = [tuple(line) for line in mesh.transpose(0, 3, 1, 2).reshape(-1, 4).tolist()]
    assert _grad_lines(mesh_ranks(layout)) == grads
    for rank in range(16):
        pos = RankPosition.of(layout, rank)
        assert mesh[pos.pipeline_rank, pos.replica, pos.cp_index, pos.tp_index] == rank
        assert layout.grad_group(pos.pipeline_rank, pos.tp_index) in grads
        assert layout.cp_group(pos.pipeline_rank, pos.replica, pos.tp_index) == tuple(mesh[pos.pipeline_rank, pos.replica, :, pos.tp_index])


def test_planner_run_refuses_a_model_without_a_sequence_split_with_one_line(tmp_path, capsys) -> None:
    """``planner run``: exit 2 with one line before torchrun starts (the launcher runs the ranks'
    own ``check_plan``)."""
    from planner.commands.cli import main

    bert = "bert:layers=2,hidden=16,heads=2,seq=8,vocab=32"
    plan = make_plan(load_workload(bert).layer_names, (), cp_degree=2)
    (tmp_path / "plan.json").write_text(json.dumps(plan_to_json(plan)))
    capsys.readouterr()
    code = main(["run", str(tmp_path / "plan.json"), "--model", bert, "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.rstrip().endswith("cp_degree 2: model 'bert' declares no context-parallel split (Workload.context_parallel)"), err
