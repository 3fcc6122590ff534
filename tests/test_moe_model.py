"""The zoo's mixture-of-experts decoder (``moe:...``, planner.models.moe) and its experts'
computation in one process (planner.models.experts): deterministic routing, the grouped
experts against a token-by-token reference, micro-batches against the whole batch, the
spec's errors. Runs split over ranks: tests/test_runtime_experts.py."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from planner.artifacts.errors import PlannerInputError
from planner.models import load_workload
from planner.models.experts import RoutedExperts, expert_modules, run_experts, token_sizes
from planner.models.moe import MoEConfig, MoEFeedForward, Router, moe_model_flops_per_sample

SMALL = "moe:layers=3,hidden=16,heads=2,seq=8,vocab=32,experts=4,topk=2,ffn=24,shared=1,dense=1,dtype=float64"


def test_spec_builds_dense_and_moe_blocks_with_a_tied_head() -> None:
    w = load_workload(SMALL)
    assert w.name == "moe" and w.layer_names == ("embed", "block0", "block1", "block2", "head")
    assert [len(expert_modules(layer)) for layer in w.layers] == [0, 0, 1, 1, 0]  # dense=1: block0 dense
    assert w.tied == (((0, "tok.weight"), (4, "proj.weight")),)
    experts = expert_modules(w.layers[2])[0]
    assert tuple(experts.w1.shape) == (4, 16, 24) and tuple(experts.w2.shape) == (4, 24, 16)
    assert w.layers[2].moe.shared is not None and w.options["topk"] == 2


@pytest.mark.parametrize(("spec", "message"), [
    ("moe:topk=9", "model spec 'moe:topk=9': topk (9) must be at most experts (8)"),
    ("moe:shared=2", "shared must be 0 or 1 (got 2)"),
    ("moe:router=sinkhorn", "router must be one of topk, balanced (got 'sinkhorn')"),
    ("moe:dense=5", "dense (5) must be at most layers (4)"),
    ("moe:experts=0", "option 'experts' must be >= 1 (got 0)"),
    ("moe:dense=-1", "option 'dense' must be >= 0 (got -1)"),
    ("moe:heads=3", "hidden (128) must be divisible by heads (3)"),
])
def test_bad_options_are_refused_in_one_line(spec: str, message: str) -> None:
    with pytest.raises(PlannerInputError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_workload(spec)
    load_workload("moe:dense=0,shared=0")  # 0 is a count these options may take


def test_router_breaks_ties_by_expert_index() -> None:
    router = Router(4, 4, 2, "topk").double()
    torch.nn.init.zeros_(router.gate.weight)  # every probability 1/4
    choices, gates = router(torch.randn(5, 4, dtype=torch.float64), torch.arange(5))
    assert choices.tolist() == [[0, 1]] * 5
    assert torch.allclose(gates, torch.full((5, 2), 0.5, dtype=torch.float64))


def test_balanced_router_spreads_every_sample_evenly() -> None:
    """Position p takes experts (p k + j) mod E: each expert s k / E tokens per sample."""
    router = Router(8, 4, 2, "balanced").double()
    choices, gates = router(torch.randn(16, 8, dtype=torch.float64), torch.arange(16))
    assert choices[:3].tolist() == [[0, 1], [2, 3], [0, 1]]
    assert torch.bincount(choices.reshape(-1), minlength=4).tolist() == [8, 8, 8, 8]
    assert torch.allclose(gates.sum(dim=1), torch.ones(16, dtype=torch.float64))


def test_grouped_experts_equal_token_by_token() -> None:
    torch.manual_seed(0)
    experts = RoutedExperts(6, 10, 4).double()
    tokens = torch.randn(9, 6, dtype=torch.float64)
    choices = torch.randint(4, (9, 2))
    choices[:, 1] = (choices[:, 0] + 1) % 4
    gates = torch.rand(9, 2, dtype=torch.float64)
    got = run_experts(tokens, choices, gates, experts.w1, experts.w2, None)
    want = torch.stack([
        sum(gates[n, j] * (F.gelu(tokens[n] @ experts.w1[choices[n, j]]) @ experts.w2[choices[n, j]]) for j in range(2))
        for n in range(9)
    ])
    assert torch.allclose(got, want, rtol=0, atol=1e-13)


def _loss_and_grads(workload: object, inputs: torch.Tensor, targets: torch.Tensor, parts: int) -> tuple[float, list[torch.Tensor]]:
    layers = workload.layers  # type: ignore[attr-defined]
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    total = 0.0
    for x, y in zip(inputs.chunk(parts), targets.chunk(parts)):
        for layer in layers:
            x = layer(x)
        loss = workload.loss_fn(x, y) / parts  # type: ignore[attr-defined]
        loss.backward()
        total += float(loss.detach())
    return total, [p.grad.clone() for layer in layers for p in layer.parameters()]


@pytest.mark.parametrize("router", ["topk", "balanced"])
def test_micro_batches_train_as_the_whole_batch(router: str) -> None:
    """Routing depends only on each token: four micro-batches give the whole batch's loss and
    gradients (what the runtime's numerics against one process rest on)."""
    w = load_workload(f"{SMALL},router={router}")
    inputs, targets = w.make_batch(8, 3)
    whole, whole_grads = _loss_and_grads(w, inputs, targets, 1)
    split, split_grads = _loss_and_grads(w, inputs, targets, 4)
    assert abs(whole - split) < 1e-13
    assert max(float((a - b).abs().max()) for a, b in zip(whole_grads, split_grads)) < 1e-13
    assert all(float(g.abs().max()) > 0 for g in whole_grads[1:])  # every parameter trains, the router too


def test_shared_expert_and_router_are_split_by_tensor_parallel_styles() -> None:
    pytest.importorskip("torch.distributed.tensor")
    w = load_workload(SMALL)
    plan = w.tensor_parallel.styles(w.layers[2], True)
    assert {"moe.shared.fc", "moe.shared.out", "moe.router.gate", "attn.q", "ln2"} <= set(plan)
    assert not any(key.startswith("moe.experts") for key in plan)
    assert "moe.router.gate" not in w.tensor_parallel.styles(w.layers[2], False)


def test_model_flops_count_active_experts() -> None:
    cfg = MoEConfig(layers=2, hidden=4, heads=1, seq=2, vocab=8, experts=4, topk=2, ffn=6, dense=1)
    attention = 8 * 2 * 16 + 4 * 4 * 4
    moe = 2 * 2 * 4 * 4 + 2 * 4 * 2 * 4 * 6
    assert moe_model_flops_per_sample(cfg) == 3 * (2 * attention + 16 * 2 * 16 + moe + 2 * 2 * 4 * 8)


def test_token_shares_are_contiguous_and_cover_the_rows() -> None:
    assert token_sizes(10, 4) == [3, 3, 2, 2] and token_sizes(4, 4) == [1, 1, 1, 1]


def test_feed_forward_flattens_sequence_major() -> None:
    """A (b, s, h) input is routed as s b rows, sequence-major, and returned as (b, s, h)."""
    cfg = MoEConfig(hidden=8, heads=2, experts=2, topk=1, ffn=4)
    ff = MoEFeedForward(cfg).double()
    x = torch.randn(3, 5, 8, dtype=torch.float64)
    out = ff(x)
    assert out.shape == x.shape
    assert torch.allclose(out[1:2, 2:3], ff(x[1:2, 2:3]), atol=1e-14)  # position 2 alone, same experts


def _saved_bytes(layer: torch.nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes ``layer(x)`` saves for backward (once per storage, parameters excluded), and its output."""
    from planner.profiling.measured.memory import saved_span, union_bytes

    params = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    spans: dict[int, list[tuple[int, int]]] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        span = saved_span(t)
        if span is not None and span[0] not in params:
            spans.setdefault(span[0], []).append((span[1], span[2]))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    return sum(union_bytes(v) for v in spans.values()), out


def test_selective_level_of_an_moe_block_recomputes_norms_and_expert_activations() -> None:
    """An MoE block's selective level (Megatron's moe_act + layernorm, not the attention core):
    both norms' outputs (b s h each) and the routed experts' GELU outputs (b s topk ffn) are not
    kept, exactly; the gradients are the same."""
    from planner.models.selective import cores, set_selective

    w = load_workload(SMALL)  # float64: b 2, s 8, h 16, topk 2, ffn 24
    block = w.layers[2]
    assert cores(block) == [block]  # the block owns the switch; its attention core is never recomputed
    x = torch.randn(2, 8, 16, dtype=torch.float64, requires_grad=True)
    grads = []
    saved = []
    for on in (False, True):
        set_selective(block, on)
        block.zero_grad(set_to_none=True)
        nbytes, out = _saved_bytes(block, x)
        (out * out).sum().backward()
        saved.append(nbytes)
        grads.append([p.grad.clone() for p in block.parameters()] + [x.grad.clone()])
        x.grad = None
    set_selective(block, False)
    assert saved[0] - saved[1] == 2 * (2 * 8 * 16 * 8) + 2 * 8 * 2 * 24 * 8
    assert all(torch.equal(a, b) for a, b in zip(*grads))
