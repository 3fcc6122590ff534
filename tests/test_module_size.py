"""The size rule of STYLE.md, as issue 46 states it: no module of ``planner/`` over 450 lines and
no function (method or nested function included) over 100 lines, so a room of the search stays
readable in one sitting. A module or function that grows past the line is split by what it
does, not trimmed of its documentation."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "planner"
MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 100


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_rule_sees_the_package() -> None:
    assert len(_modules()) > 100


def test_no_module_over_450_lines() -> None:
    over = {str(p.relative_to(PACKAGE)): n for p in _modules() if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert not over, f"modules over {MAX_MODULE_LINES} lines: {over}"


def test_no_function_over_100_lines() -> None:
    over = {}
    for path in _modules():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    over[f"{path.relative_to(PACKAGE)}:{node.name}"] = lines
    assert not over, f"functions over {MAX_FUNCTION_LINES} lines: {over}"
