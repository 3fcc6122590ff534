"""A plain-text table for the terminal: the one format every command's tables share (the plan's,
the run report's, the comparison's), kept here so that the runtime (whose rank 0 prints its
run's summary) and the report modules both reach it."""

from __future__ import annotations

__all__ = ["format_table"]


def format_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> str:
    """``headers`` over a dashed rule over ``rows``, columns two spaces apart; the columns in
    ``right`` (default: all but the first) right-aligned."""
    right = right if right is not None else set(range(1, len(headers)))
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])
