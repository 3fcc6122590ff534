"""Measure a torch model into a :class:`planner.artifacts.profile.Profile` (imports torch).

The profiler is imported when first asked for (PEP 562), so that importing one of this
package's modules -- the runtime's checks read :mod:`planner.profiling.measured.memory` on
every rank and in the launcher -- does not import the profiler and, through its tensor-parallel
checks, ``torch.distributed.tensor`` (about 0.9 s here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from planner.profiling.measured.profiler import detect_tied, profile_model

__all__ = ["detect_tied", "profile_model"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from planner.profiling.measured import profiler

        return getattr(profiler, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
