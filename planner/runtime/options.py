"""Runtime options: what ``python -m planner.runtime`` is asked to do, as one frozen value.

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
        if self.num_steps < 1:
            raise ValueError(f"--steps must be >= 1 (got {self.num_steps})")
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"--timeout-s must be > 0 (got {self.timeout_s})")
        if self.checkpoint_every < 0:
            raise ValueError(f"--checkpoint-every must be >= 0 (got {self.checkpoint_every})")
        if self.keep_last < 0:
            raise ValueError(f"--keep-last must be >= 0 (got {self.keep_last})")
        if self.checkpoint_every and not self.checkpoint_dir:
            raise ValueError("--checkpoint-every needs --checkpoint-dir")
        if self.resume and not self.checkpoint_dir:
            raise ValueError("--resume needs --checkpoint-dir")
        if self.dtype not in RUNTIME_DTYPES:
            names = " or ".join(d.value for d in RUNTIME_DTYPES)
            raise ValueError(f"--dtype must be {names} (got {self.dtype.value!r})")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"--lr must be > 0 (got {self.lr})")
        if self.warmup_steps < 0:
            raise ValueError(f"--warmup-steps must be >= 0 (got {self.warmup_steps})")
