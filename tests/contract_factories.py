"""Workloads that test the layer and loss contracts (``tests.contract_factories:<name>`` specs).

Each is five layers (a boundary may fall after any of the first four) whose second layer
returns what is being tested; plus a factory that raises, and a padded language model whose
loss is ``(sum, count)`` over the tokens that are not padding.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from planner.models.workload import Workload
from tests.factories import WIDTH, Block, _gen, _mse


class Returns(nn.Module):
    """A linear layer whose output is wrapped by ``wrap`` (a dict, a list, a nested tuple...)."""

    def __init__(self, wrap: Callable[[torch.Tensor], Any]) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)
        self.wrap = wrap

    def forward(self, x: torch.Tensor) -> Any:
        return self.wrap(torch.tanh(self.fc(x)))


class Unwrap(nn.Module):
    """Takes the first tensor of whatever the layer before returned."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: Any) -> torch.Tensor:
        for _ in range(3):  # bounded: under torch.fx tracing x is a Proxy, neither dict nor tuple
            if isinstance(x, dict):
                x = next(iter(x.values()))
            elif isinstance(x, (tuple, list)):
                x = x[0]
        if isinstance(x, torch.Tensor) and x.is_complex():
            x = x.real
        return torch.tanh(self.fc(x))


class Transposed(nn.Module):
    """``(W x^T)^T + b``: the right values as a transposed, non-contiguous view."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh((self.fc.weight @ x.t()).t() + self.fc.bias)


def _workload(name: str, second: nn.Module, third: nn.Module | None = None) -> Workload:
    layers = (Block(WIDTH), second, third or Block(WIDTH), Block(WIDTH), nn.Linear(WIDTH, 4))

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 4, generator=g)

    return Workload(
        name=name,
        layers=layers,
        layer_names=("block_0", "block_1", "block_2", "block_3", "head"),
        make_batch=make_batch,
        loss_fn=_mse,
    )


def returns_dict() -> Workload:
    return _workload("returns-dict", Returns(lambda h: {"last_hidden_state": h, "hidden_states": h}), Unwrap())


def returns_model_output() -> Workload:
    from transformers.modeling_outputs import BaseModelOutput

    return _workload("returns-model-output", Returns(lambda h: BaseModelOutput(last_hidden_state=h)), Unwrap())


def returns_list() -> Workload:
    return _workload("returns-list", Returns(lambda h: [h, h]), Unwrap())


def returns_nested() -> Workload:
    return _workload("returns-nested", Returns(lambda h: (h, (h, h))), Unwrap())


def returns_none_in_tuple() -> Workload:
    return _workload("returns-none", Returns(lambda h: (h, None)), Unwrap())


def returns_complex() -> Workload:
    return _workload("returns-complex", Returns(lambda h: torch.complex(h, h)), Unwrap())


def transposed() -> Workload:
    """A non-contiguous tensor crosses the boundary after layer 1 (accepted: the runtime sends
    a contiguous copy)."""
    return _workload("transposed", Transposed())


def raising() -> Workload:
    raise RuntimeError("cannot build this model here")


# ------------------------------------------------------------------ token-weighted loss
VOCAB = 16
SEQ = 6
PAD = -100  # F.cross_entropy's ignore_index


class TokenEmbed(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, WIDTH)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.tok(tokens)


def padded_lm() -> Workload:
    """An embedding, three blocks and an LM head over sequences padded to ``SEQ``: each sample
    keeps 1..SEQ real tokens, the rest of its targets are ``PAD``. The loss is the summed
    cross-entropy over real tokens and their count, so a step's loss is the mean over the
    step's real tokens, however they fall into micro-batches (a mean per micro-batch would
    weigh a micro-batch of short samples like one of long samples)."""
    layers = (TokenEmbed(), Block(WIDTH), Block(WIDTH), Block(WIDTH), nn.Linear(WIDTH, VOCAB))

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        tokens = torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
        targets = torch.randint(0, VOCAB, (batch_size, SEQ), generator=g)
        lengths = torch.randint(1, SEQ + 1, (batch_size, 1), generator=g)
        targets[torch.arange(SEQ).expand(batch_size, SEQ) >= lengths] = PAD
        return tokens, targets

    def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        total = F.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1), ignore_index=PAD, reduction="sum")
        return total, (targets != PAD).sum()

    return Workload(
        name="padded-lm",
        layers=layers,
        layer_names=("embed", "block_1", "block_2", "block_3", "head"),
        make_batch=make_batch,
        loss_fn=loss_fn,
    )


# ---------------------------------------------------------------- the batch and the factory itself (issue 23)


def swapped_batch() -> Workload:
    """``make_batch(seed, n)``: the arguments swapped, so ``make_batch(b, 0)`` draws no samples."""
    base = _workload("swapped-batch", Block(WIDTH))

    def make_batch(seed: int, batch_size: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, 4, generator=g)

    return Workload(name=base.name, layers=base.layers, layer_names=base.layer_names, make_batch=make_batch, loss_fn=_mse)


def fixed_batch() -> Workload:
    """Targets of three samples whatever the batch size asked for."""
    base = _workload("fixed-batch", Block(WIDTH))

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, WIDTH, generator=g), torch.randn(3, generator=g)

    return Workload(name=base.name, layers=base.layers, layer_names=base.layer_names, make_batch=make_batch,
                    loss_fn=lambda out, target: out.sum() * 0 + target.sum() * 0 + out.pow(2).mean())


class NoGrad(nn.Module):
    """A layer with no parameters whose output needs no gradient: it saves nothing."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.detach() * 2


def saves_nothing() -> Workload:
    """Every layer saves nothing for backward (nothing to train)."""

    def make_batch(batch_size: int, seed: int) -> tuple[Any, Any]:
        g = _gen(seed)
        return torch.randn(batch_size, WIDTH, generator=g), torch.randn(batch_size, WIDTH, generator=g)

    return Workload(name="saves-nothing", layers=(NoGrad(), NoGrad()), layer_names=("a", "b"), make_batch=make_batch,
                    loss_fn=lambda out, target: (out - target).pow(2).mean())


def interrupts() -> Workload:
    """A factory that raises KeyboardInterrupt itself (not a Ctrl-C)."""
    raise KeyboardInterrupt


def recurses(depth: int = 0) -> Workload:
    """A factory that recurses without end."""
    return recurses(depth + 1)
