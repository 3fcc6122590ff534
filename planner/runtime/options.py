"""Runtime options: what ``python -m planner.runtime`` is asked to do, as one frozen value.

Every number is in a stated range (:data:`RANGES`), checked here and by both parsers that
produce it (``planner run``'s and the rank's own, ``planner.runtime.main``), so the launcher
refuses a flag before torchrun starts exactly as a rank would. Decisions: ``--timeout-s`` in
[1 s, 7 days] (below 1 s gloo's own connects time out on a loaded machine; the upper bound
keeps the collective timeout finite in milliseconds); ``--lr`` in [1e-12, 10] (above any
learning rate SGD or AdamW trains with: ``--lr 1e308`` trained to a non-finite loss and failed
only after the last step); counts (steps, checkpoint interval, ...) up to 2^31 - 1; the seed up
to 2^63 - 1 (``torch.manual_seed``'s range).

The run's element type is a :class:`~planner.artifacts.kinds.DType` of
:data:`~planner.artifacts.kinds.RUNTIME_DTYPES` and its optimizer an
:class:`~planner.artifacts.kinds.OptimizerFamily` (what a plan's ``OptimizerKind.family`` names).
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from planner.artifacts.kinds import RUNTIME_DTYPES, DType, OptimizerFamily


class FaultKind(enum.Enum):
    """A deliberate failure, for testing fail-fast and resume: raise, SIGKILL itself, SIGSTOP
    itself (a process that stops answering), or hang (alive, in a loop that never returns)."""

    NONE = "none"
    RAISE = "raise"
    KILL = "kill"
    STOP = "stop"
    HANG = "hang"


MAX_COUNT_FLAG = 2**31 - 1
#: each number's range: the flag, and (low, high) inclusive
RANGES: dict[str, tuple[str, float, float]] = {
    "num_steps": ("--steps", 1, MAX_COUNT_FLAG),
    "timeout_s": ("--timeout-s", 1.0, 7 * 86400.0),
    "checkpoint_every": ("--checkpoint-every", 0, MAX_COUNT_FLAG),
    "keep_last": ("--keep-last", 0, MAX_COUNT_FLAG),
    "lr": ("--lr", 1e-12, 10.0),
    "seed": ("--seed", 0, 2**63 - 1),
    "warmup_steps": ("--warmup-steps", 0, MAX_COUNT_FLAG),
    "fault_rank": ("--fault-rank", 0, MAX_COUNT_FLAG),
    "fault_step": ("--fault-step", 0, MAX_COUNT_FLAG),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeOptions:
    plan_path: str
    model_spec: str
    num_steps: int = 3
    report_path: str = ""
    emulate: bool = field(default=False, metadata={"doc": "each stage chunk takes its profiled fwd/bwd time (sleeps)"})
    profile_path: str = field(default="", metadata={"doc": "per-layer times for --emulate; else the plan's"})
    timeout_s: float = 60.0
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    keep_last: int = field(default=3, metadata={"doc": "complete checkpoints kept (0: all)"})
    resume: bool = False
    trust_unverified_checkpoint: bool = field(
        default=False, metadata={"doc": "--resume may load a directory without manifests, unverified"})
    allow_resume_change: tuple[str, ...] = field(default=(), metadata={"doc": "settings a resume may change: lr"})
    dtype: DType = field(default=DType.FLOAT32, metadata={"doc": "one of RUNTIME_DTYPES (its value is accepted too)"})
    optimizer: OptimizerFamily = field(default=OptimizerFamily.SGD, metadata={"doc": "SGD or AdamW (its value is accepted too)"})
    lr: float = 0.01
    seed: int = 0
    warmup_steps: int = field(default=1, metadata={"doc": "steps left out of the timing summary"})
    fault: FaultKind = FaultKind.NONE
    fault_rank: int = 0
    fault_step: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "dtype", DType(self.dtype))
        object.__setattr__(self, "optimizer", OptimizerFamily(self.optimizer))
        for name, (flag, lo, hi) in RANGES.items():
            value = getattr(self, name)
            integer = isinstance(lo, int)
            if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
                raise ValueError(f"{flag} must be {'an integer' if integer else 'a number'} (got {value!r})")
            if not (math.isfinite(value) and lo <= value <= hi):
                shown = f"[{lo:,}, {hi:,}]" if integer else f"[{lo:g}, {hi:g}]"
                raise ValueError(f"{flag} must be in {shown} (got {value!r})")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir")
        if self.trust_unverified_checkpoint and not self.resume:
            raise ValueError("--trust-unverified-checkpoint applies to --resume only")
        if self.dtype not in RUNTIME_DTYPES:
            names = " or ".join(d.value for d in RUNTIME_DTYPES)
            raise ValueError(f"--dtype must be {names} (got {self.dtype.value!r})")
