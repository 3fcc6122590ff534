"""Tiny workloads and hand-built plans for the runtime tests (``tests.factories:<name>`` specs).

Each factory takes no arguments (the runtime seeds the global RNG before calling it) and
returns a float32 Workload; the runtime casts it to ``--dtype``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.artifacts.kinds import ScheduleKind, ZeroStage
from planner.artifacts.layout import Layout
from planner.artifacts.plan import Plan, PlanStage, StageMemory
from planner.artifacts.stack import DEFAULT_STACK, Stack
from planner.models.workload import TensorParallel, Workload
from tests.plan_factory import hand_plan

WIDTH = 8


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _mse(out: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(out, target.to(out.dtype))


class Block(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


def mlp() -> Workload:
    """Four tanh blocks and a linear head: the plain chain."""
    layers = tuple([Block(WIDTH) for _ in range(4)] + [nn.Linear(WIDTH, 4)])

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 4, generator=g)

    return Workload(
        name="mlp",
        layers=layers,
        layer_names=tuple(f"block{i}" for i in range(4)) + ("head",),
        make_batch=make_batch,
        loss_fn=_mse,
    )


def mlp_swapped_batch() -> Workload:
    """:func:`mlp` whose ``make_batch`` takes ``(seed, batch_size)``: the same fingerprint, a
    batch of ``seed`` samples (issue 51)."""
    base = mlp()

    def make_batch(seed: int, batch_size: int) -> tuple[Any, Any]:
        return base.make_batch(batch_size, seed)

    return dataclasses.replace(base, make_batch=make_batch)


class RMSNorm(nn.Module):
    """Llama's RMSNorm, its weight a plain parameter: ``weight * x / rms(x)``."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6)


class GatedMLP(nn.Module):
    """A Llama-style MLP block: RMSNorm, then ``down(silu(gate(x)) * up(x))``, plus the residual."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = RMSNorm(width)
        self.gate = nn.Linear(width, 2 * width, bias=False)
        self.up = nn.Linear(width, 2 * width, bias=False)
        self.down = nn.Linear(2 * width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def gated_mlp_declared() -> Workload:
    """Two :class:`GatedMLP` blocks declared split by ``{"gate": "colwise", "up": "colwise",
    "down": "rowwise"}``: the column splits' parent is the block itself, so its input becomes a
    DTensor before the RMSNorm, whose weight stays a plain tensor (issue 51: refused at profile
    time, naming the cause)."""
    seq = 4
    layers = (GatedMLP(WIDTH), GatedMLP(WIDTH), nn.Linear(WIDTH, 4))

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, seq, WIDTH, generator=g), torch.randn(batch_size, seq, 4, generator=g)

    return Workload(
        name="gated-mlp",
        layers=layers,
        layer_names=("mlp0", "mlp1", "head"),
        make_batch=make_batch,
        loss_fn=_mse,
        tensor_parallel=TensorParallel.from_plan({"gate": "colwise", "up": "colwise", "down": "rowwise"},
                                                 must_divide=(2 * WIDTH,), sequence_length=seq),
    )


def mlp_wide() -> Workload:
    """Same layer names as :func:`mlp`, wider layers: a different fingerprint."""
    layers = tuple([Block(2 * WIDTH)] + [Block(2 * WIDTH) for _ in range(3)] + [nn.Linear(2 * WIDTH, 4)])

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, 2 * WIDTH, generator=g), torch.randn(batch_size, 4, generator=g)

    return Workload(
        name="mlp-wide",
        layers=layers,
        layer_names=tuple(f"block{i}" for i in range(4)) + ("head",),
        make_batch=make_batch,
        loss_fn=_mse,
    )


class Fork(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = torch.tanh(self.fc(x))
        return h, h


class Carry(nn.Module):
    """Transforms the main path, carries the skip tensor along."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        h, skip = hx
        return torch.tanh(self.fc(h)), skip


class Join(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, 4)

    def forward(self, hx: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        h, skip = hx
        return self.fc(h + skip)


def skip() -> Workload:
    """A skip connection spanning three layers: tuples cross the stage boundaries."""
    layers = (Fork(), Carry(), Carry(), Carry(), Join())

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 4, generator=g)

    return Workload(
        name="skip",
        layers=layers,
        layer_names=("fork", "carry1", "carry2", "carry3", "join"),
        make_batch=make_batch,
        loss_fn=_mse,
    )


VOCAB = 16
SEQ = 4


class Embed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


class Head(nn.Module):
    def __init__(self, tied: nn.Parameter) -> None:
        super().__init__()
        self.proj = nn.Linear(WIDTH, VOCAB, bias=False)
        self.proj.weight = tied

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x)


def tiny_gpt(seq: int = SEQ) -> Workload:
    """Embedding, three residual blocks, a head tied to the embedding; ``seq`` tokens per
    sample (no parameter depends on it: ``tests.factories:tiny_gpt:seq=8`` has the same
    fingerprint and twice the activations)."""
    embed = Embed()
    layers = (embed, Block(WIDTH), Block(WIDTH), Block(WIDTH), Head(embed.tok.weight))

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        tokens = torch.randint(0, VOCAB, (batch_size, seq + 1), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))

    return Workload(
        name="tiny-gpt",
        layers=layers,
        layer_names=("embed", "block0", "block1", "block2", "head"),
        make_batch=make_batch,
        loss_fn=loss_fn,
        tied=(((0, "tok.weight"), (4, "proj.weight")),),
    )


def tiny_gpt_undeclared_tie() -> Workload:
    """:func:`tiny_gpt` whose head shares the embedding's ``Parameter`` object without declaring
    the tie (``tied`` empty): the runtime must find it by identity, as the profiler does."""
    return dataclasses.replace(tiny_gpt(), name="tiny-gpt-undeclared-tie", tied=())


class Down(nn.Module):
    """U-Net encoder level: (pool,) 3x3 convolution, ReLU; carries the skip tensors along."""

    def __init__(self, c_in: int, c_out: int, pool: bool, skip: bool = True) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_in, c_out, 3, padding=1)
        self.pool = pool
        self.skip = skip

    def forward(self, x: Any) -> tuple[torch.Tensor, ...]:
        h, skips = (x, ()) if isinstance(x, torch.Tensor) else (x[0], x[1:])
        out = F.relu(self.conv(F.max_pool2d(h, 2) if self.pool else h))
        return (out, *skips, out) if self.skip else (out, *skips)  # an encoder level's output is also its skip


class Up(nn.Module):
    """U-Net decoder level: upsample, concatenate the matching skip, 3x3 convolution, ReLU."""

    def __init__(self, c_low: int, c_skip: int, c_out: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(c_low + c_skip, c_out, 3, padding=1)

    def forward(self, x: tuple[torch.Tensor, ...]) -> Any:
        h, *skips = x
        up = F.interpolate(h, scale_factor=2.0, mode="nearest")
        out = F.relu(self.conv(torch.cat([up, skips[-1]], dim=1)))
        return (out, *skips[:-1]) if len(skips) > 1 else out


UNET_CHANNELS, UNET_IMAGE = 8, 32


def unet() -> Workload:
    """A small U-Net (Ronneberger et al. 2015): two encoder levels and a bottleneck whose
    outputs are concatenated into the decoder (skips crossing up to three layers), 32 x 32
    images, per-pixel MSE. Its ReLU outputs are saved by the ReLU and by the next layer's
    pooling / convolution: storages two layers share."""
    c = UNET_CHANNELS
    layers = (Down(1, c, False), Down(c, 2 * c, True), Down(2 * c, 4 * c, True, skip=False), Up(4 * c, 2 * c, 2 * c),
              Up(2 * c, c, c), nn.Conv2d(c, 1, 1))

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        x = torch.randn(batch_size, 1, UNET_IMAGE, UNET_IMAGE, generator=g)
        return x, torch.randn(batch_size, 1, UNET_IMAGE, UNET_IMAGE, generator=g)

    return Workload(
        name="unet",
        layers=layers,
        layer_names=("down0", "down1", "bottom", "up1", "up0", "head"),
        make_batch=make_batch,
        loss_fn=_mse,
    )


FACTORIES = {
    "mlp": mlp, "mlp_wide": mlp_wide, "skip": skip, "tiny_gpt": tiny_gpt, "tiny_gpt_undeclared_tie": tiny_gpt_undeclared_tie,
    "unet": unet,
}


def _memory() -> StageMemory:
    return StageMemory(
        param_bytes=0, grad_bytes=0, optimizer_bytes=0, activation_bytes=0, recompute_workspace_bytes=0, buffer_bytes=0
    )


def make_plan(
    layer_names: tuple[str, ...],
    boundaries: tuple[int, ...],
    *,
    dp_degree: int = 1,
    num_microbatches: int = 2,
    microbatch_size: int = 2,
    schedule: ScheduleKind = ScheduleKind.GPIPE,
    recompute: bool = False,
    selective: bool = False,
    fingerprint: str = "",
    model: str = "test",
    virtual_stages_per_rank: int = 1,
    tp_degree: int = 1,
    sequence_parallel: bool = False,
    zero: int = 0,
    stack: Stack = DEFAULT_STACK,
    cp_degree: int = 1,
) -> Plan:
    """A plan cutting ``layer_names`` before each index in ``boundaries``; with ``recompute``
    every stage but the last recomputes all its layers (the last recomputes its first); with
    ``selective`` every other layer recomputes its attention cores (selective recomputation;
    a no-op in layers without one). The
    stages' ranks are the Layout's (``Layout.stage_ranks``): with ``virtual_stages_per_rank`` = v
    (interleaved 1F1B) stage s runs on pipeline rank s mod P, P = num_stages / v; with
    ``tp_degree`` = t (and ``cp_degree`` = c) each stage replica is t (x c) ranks. ``zero``: the ZeRO stage; ``stack``: the
    training stack the plan is for (how the runtime buckets and overlaps the all-reduce)."""
    cuts = (0, *boundaries, len(layer_names))
    num_stages = len(cuts) - 1
    layout = Layout(num_stages=num_stages, virtual_stages_per_rank=virtual_stages_per_rank, dp_degree=dp_degree,
                    tp_degree=tp_degree, sequence_parallel=sequence_parallel, cp_degree=cp_degree,
                    zero=ZeroStage(zero), placement=schedule.placement)
    stages = []
    for s in range(num_stages):
        start, stop = cuts[s], cuts[s + 1]
        rc = tuple(range(start, stop)) if recompute and s < num_stages - 1 else ((start,) if recompute else ())
        sel = tuple(i for i in range(start, stop) if i not in rc) if selective else ()
        stages.append(
            PlanStage(
                stage_idx=s,
                layer_start=start,
                layer_stop=stop,
                layer_names=layer_names[start:stop],
                ranks=layout.stage_ranks(s),
                recompute=rc,
                recompute_selective=sel,
                inflight_microbatches=num_microbatches,
                activation_bytes_per_microbatch=0,
                fwd_ms=0.0,
                bwd_ms=0.0,
                recompute_ms=0.0,
                send_fwd_ms=0.0,
                send_bwd_ms=0.0,
                allreduce_ms=0.0,
                memory=_memory(),
                memory_total_bytes=0,
                memory_cap_bytes=0,
            )
        )
    plan = hand_plan(
        stages,
        dp_degree=dp_degree,
        num_microbatches=num_microbatches,
        microbatch_size=microbatch_size,
        schedule=schedule,
        virtual_stages_per_rank=virtual_stages_per_rank,
        model=model,
        cluster_name="local-cpu",
        fingerprint=fingerprint,
        tp_degree=tp_degree,
        sequence_parallel=sequence_parallel,
        cp_degree=cp_degree,
    )
    return dataclasses.replace(plan, layout=layout, stack=stack)
