"""The compute-only CSV of ``torch.distributed.pipelining``: one row per rank, one cell per
action (``2F0``), as ``PipelineScheduleMulti._dump_csv`` writes and ``_load_csv`` reads
(torch/distributed/pipelining/schedules.py)."""

from __future__ import annotations

import csv
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.schedule.actions import Schedule, parse_action

__all__ = ["read_schedule_csv", "write_schedule_csv"]


def write_schedule_csv(schedule: Schedule, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for actions in schedule:
            writer.writerow([str(a) for a in actions])


def read_schedule_csv(path: str | Path) -> Schedule:
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise PlannerInputError(f"{path}: cannot read schedule CSV ({exc.strerror})") from exc
    try:
        return tuple(tuple(parse_action(cell) for cell in row if cell.strip()) for row in rows)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{path}: {exc}") from exc
