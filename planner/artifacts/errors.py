"""Errors the planner raises on purpose. The CLI maps each to an exit code.

- :class:`PlannerInputError` (exit 2): a file, flag or value is invalid. The message is one
  line naming the file, the field path and the offending value.
- :class:`InfeasibleError` (exit 3): the request is valid but no plan satisfies it; the
  message explains the tightest stage, how many bytes it is over, and what would make it fit.
"""

from __future__ import annotations

from collections.abc import Callable


class PlannerError(Exception):
    """Base class of every error the planner raises deliberately."""

    exit_code = 1


class PlannerInputError(PlannerError, ValueError):
    """Invalid input: a malformed or inconsistent document, flag or model spec."""

    exit_code = 2


class InfeasibleError(PlannerError):
    """A valid request that no plan can satisfy (usually: does not fit in memory)."""

    exit_code = 3

    def __init__(self, message: str, *, suggestions: tuple[str, ...] = (), need_bytes: float = float("inf"),
                 more: Callable[[], InfeasibleError] | None = None) -> None:
        self.suggestions = suggestions
        self.need_bytes = need_bytes  # the least per-device memory the explanation found (inf: not measured)
        # where set: the same refusal with the suggestions that cost more searching worked out (a
        # search measures every degree's refusal but shows only the closest: :meth:`complete`)
        self.more = more
        text = message
        if suggestions:
            text += "\n" + "\n".join(f"  - {s}" for s in suggestions)
        super().__init__(text)

    def complete(self) -> InfeasibleError:
        """This refusal with all its suggestions (itself when it has them all)."""
        return self.more() if self.more is not None else self
