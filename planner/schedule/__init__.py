"""Pipeline schedules as data: per-rank action orders, their rules, a dry run and torch's CSV.

No torch here; ``torch.distributed.pipelining`` can load what :func:`write_schedule_csv` writes.
"""

from planner.schedule.actions import Action, ActionKind, Schedule, parse_action
from planner.schedule.build import build_replicated_schedule, build_schedule, replicated_warmup
from planner.schedule.csv_io import read_schedule_csv, write_schedule_csv
from planner.schedule.inflight import (
    Held,
    held_bytes,
    held_counts,
    inflight_counts,
    layout_schedule,
    stage_inflight,
    weight_pending_counts,
)
from planner.schedule.rules import check_schedule_rules
from planner.schedule.validate import ScheduleError, format_grid, validate_schedule

__all__ = [
    "Action",
    "ActionKind",
    "Held",
    "Schedule",
    "ScheduleError",
    "build_replicated_schedule",
    "build_schedule",
    "check_schedule_rules",
    "format_grid",
    "held_bytes",
    "held_counts",
    "inflight_counts",
    "layout_schedule",
    "parse_action",
    "read_schedule_csv",
    "replicated_warmup",
    "stage_inflight",
    "validate_schedule",
    "weight_pending_counts",
    "write_schedule_csv",
]
