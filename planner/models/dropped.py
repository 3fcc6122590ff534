"""An output recomputed in backward instead of kept: Megatron-Core's ``CheckpointWithoutOutput``
(``--recompute-modules moe_act layernorm``) as saved-tensor hooks.

Checkpointing a function (``torch.utils.checkpoint``) frees what the function itself saves, but
not its *output*, which the next operation saves as its input: a GELU's output is what the
expert's second GEMM keeps, a layer norm's output what the projections after it keep.
Megatron-Core frees that output once its consumers have run and recomputes it before their
backward. Here, inside :func:`recomputed`, every tensor autograd saves that views the
output's storage is packed as a small handle instead (the function and its inputs, which are
kept anyway: a GELU's input by the GELU, a norm's by the norm) and recomputed, under
``no_grad``, when the backward unpacks it; everything else goes to the hooks around the block
(the runtime's saved-bytes meter, the profiler's count), as if this were not there.

Only the innermost pair of saved-tensor hooks applies (torch's documentation), so the outer pair
is read with ``torch._C._autograd._top_saved_tensors_default_hooks`` (private; typed in torch's
stubs; checked with torch 2.13) and called for everything else, as
:meth:`planner.models.context.SequenceShard.regathering` does. Tensors without a storage of
their own (DTensors: a tensor-parallel consumer saves its DTensor input) are never matched:
under tensor parallelism the norms' outputs stay kept.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["recomputed"]


def _storage_key(tensor: torch.Tensor) -> int:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except (RuntimeError, NotImplementedError):
        return -1


@dataclass(frozen=True, slots=True)
class _Handle:
    """A saved view of the dropped output: how to recompute it and where the view sits."""

    recompute: Callable[[], torch.Tensor]
    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int

    def unpack(self) -> torch.Tensor:
        with torch.no_grad():
            whole = self.recompute()
        return whole.as_strided(self.size, self.stride, self.offset)


@contextlib.contextmanager
def recomputed(output: torch.Tensor, recompute: Callable[[], torch.Tensor]) -> Iterator[None]:
    """Within the block, saved tensors sharing ``output``'s storage are recomputed by
    ``recompute()`` in backward instead of kept (module docstring). ``recompute`` must return a
    contiguous tensor laid out as ``output`` (the same function on the same inputs)."""
    key = _storage_key(output)
    if key < 0 or output.storage_offset() != 0 or not output.is_contiguous():
        yield
        return
    outer = torch._C._autograd._top_saved_tensors_default_hooks(False)

    def pack(tensor: torch.Tensor) -> Any:
        if _storage_key(tensor) == key:
            return _Handle(recompute, tuple(tensor.size()), tuple(tensor.stride()), tensor.storage_offset())
        return tensor.detach() if outer is None else outer[0](tensor)

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, _Handle):
            return packed.unpack()
        return packed if outer is None else outer[1](packed)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield
