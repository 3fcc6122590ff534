"""AdamW with its moments in bfloat16: the lean optimizer state of ``adam-mixed-bf16-moments``
and ``adam-bf16`` (``planner.artifacts.kinds.OptimizerKind``), 2 + 2 bytes of moments per
parameter instead of 4 + 4.

The update is PyTorch's AdamW (Loshchilov & Hutter 2019, ``torch.optim.AdamW``'s single-tensor
algorithm) computed in the parameter's dtype: each step reads the bf16 moments, widens them,
updates them, and stores them back rounded to bfloat16 (round to nearest even), as DeepSeek-V3
keeps AdamW's moments in BF16 (DeepSeek-AI 2024, tech. report sec. 3.3.3) and Megatron-Core's
``--exp-avg-dtype bf16 --exp-avg-sq-dtype bf16`` do. A subclass of ``torch.optim.AdamW``: its
state has AdamW's keys (``exp_avg``, ``exp_avg_sq``, ``step``), so checkpoints and ZeRO's
sharded state (``planner.runtime.zero``) treat it as AdamW; the step is elementwise, so a
shard's update equals the whole tensor's.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import torch

__all__ = ["Bf16MomentsAdamW"]


class Bf16MomentsAdamW(torch.optim.AdamW):
    """AdamW whose ``exp_avg`` and ``exp_avg_sq`` are kept in bfloat16 (module docstring)."""

    MOMENT_DTYPE = torch.bfloat16

    def __init__(self, params: Iterable[torch.nn.Parameter], lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 1e-2) -> None:
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, foreach=False)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:  # type: ignore[override]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, eps, wd = group["lr"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = torch.tensor(0.0)
                    state["exp_avg"] = torch.zeros_like(p, dtype=self.MOMENT_DTYPE)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=self.MOMENT_DTYPE)
                state["step"] += 1
                step = float(state["step"])
                grad = p.grad.to(p.dtype)
                m = state["exp_avg"].to(p.dtype).lerp_(grad, 1 - beta1)
                v = state["exp_avg_sq"].to(p.dtype).mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                state["exp_avg"].copy_(m)
                state["exp_avg_sq"].copy_(v)
                p.mul_(1 - lr * wd)
                bias1, bias2 = 1 - beta1**step, 1 - beta2**step
                denom = (v.sqrt() / bias2**0.5).add_(eps)
                p.addcdiv_(m, denom, value=-lr / bias1)
        return loss
