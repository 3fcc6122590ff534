"""Optimizer-state offload in the runtime (a plan's ``offload`` of ``optimizer`` or ``both``;
ZeRO-Offload, Ren et al. 2021; pricing: :mod:`planner.cost.offload`).

:class:`HostOffloadOptimizer` wraps a rank's optimizer of one stage chunk: its parameters stay on
the device (what the forward, the backward, the gradient synchronisation and the ZeRO shards
read), while a host copy of each (the master weights: fp32 where the device's are 16-bit, in
pinned memory when the device is a GPU) and the inner optimizer's state over those copies live
on the host. A step copies the gradients down into the copies' ``.grad``, steps the inner
optimizer there, and copies the updated weights back up. On a CPU run the "host" is the same
memory, but a separate buffer: the code path is the one a GPU run takes, and the numerics equal
the un-offloaded optimizer's (tests/test_offload.py: losses against one process).
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["HostOffloadOptimizer", "offloaded"]

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def _host_copy(param: torch.Tensor) -> torch.nn.Parameter:
    dtype = torch.float32 if param.dtype in _SIXTEEN_BIT else param.dtype
    pinned = param.device.type == "cuda"
    host = torch.empty(param.shape, dtype=dtype, device="cpu", pin_memory=pinned)
    host.copy_(param.detach())
    return torch.nn.Parameter(host, requires_grad=param.requires_grad)


class HostOffloadOptimizer(torch.optim.Optimizer):
    """``inner``'s kind of optimizer stepping host copies of ``inner``'s parameters (module
    docstring). ``param_groups`` are the device parameters' (what gradient scaling and the
    synchronisation read); ``state_dict`` / ``load_state_dict`` are the inner optimizer's."""

    def __init__(self, inner: torch.optim.Optimizer) -> None:
        device_params = [p for group in inner.param_groups for p in group["params"]]
        super().__init__(device_params, dict(inner.defaults))
        self.pairs = [(p, _host_copy(p)) for p in device_params]
        groups = []
        for group in inner.param_groups:
            hosts = [h for p, h in self.pairs if any(p is q for q in group["params"])]
            groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": hosts})
        self.inner = type(inner)(groups, **{k: v for k, v in inner.defaults.items() if k in _init_keys(inner)})

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """Gradients down, the inner step on the host, weights up."""
        for device, host in self.pairs:
            host.grad = None if device.grad is None else device.grad.detach().to("cpu", dtype=host.dtype, copy=True)
        out = self.inner.step(closure)
        for device, host in self.pairs:
            device.copy_(host.to(device.device, dtype=device.dtype, non_blocking=True))
        return out

    def state_dict(self) -> dict[str, Any]:
        return self.inner.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.inner.load_state_dict(state_dict)

    def host_state_bytes(self) -> int:
        """Bytes of the host copies and the inner optimizer's state tensors."""
        total = sum(h.numel() * h.element_size() for _, h in self.pairs)
        for state in self.inner.state.values():
            total += sum(t.numel() * t.element_size() for t in state.values() if torch.is_tensor(t) and t.dim() > 0)
        return total


def _init_keys(inner: torch.optim.Optimizer) -> set[str]:
    import inspect

    return set(inspect.signature(type(inner).__init__).parameters) - {"self", "params"}


def offloaded(optimizer: torch.optim.Optimizer | None, offload: bool) -> torch.optim.Optimizer | None:
    """``optimizer`` on the host when ``offload`` (and there is one), else itself."""
    return HostOffloadOptimizer(optimizer) if offload and optimizer is not None else optimizer
