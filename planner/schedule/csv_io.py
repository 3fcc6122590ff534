"""The compute-only CSV of ``torch.distributed.pipelining``: one row per rank, one cell per
action (``2F0``), as ``PipelineScheduleMulti._dump_csv`` writes and ``_load_csv`` reads
(torch/distributed/pipelining/schedules.py)."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.reading import read_text
from planner.schedule.actions import Schedule, parse_action

__all__ = ["read_schedule_csv", "write_schedule_csv"]


def write_schedule_csv(schedule: Schedule, path: str | Path) -> None:
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        for actions in schedule:
            writer.writerow([str(a) for a in actions])


def read_schedule_csv(path: str | Path) -> Schedule:
    """A schedule CSV, read as every input is (``planner.artifacts.reading``: a regular UTF-8
    file of bounded size; a FIFO or a device refused in one line)."""
    rows = list(csv.reader(io.StringIO(read_text(path, "schedule CSV"), newline="")))
    try:
        return tuple(tuple(parse_action(cell) for cell in row if cell.strip()) for row in rows)
    except PlannerInputError as exc:
        raise PlannerInputError(f"{path}: {exc}") from exc
