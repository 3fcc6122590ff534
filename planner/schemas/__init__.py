"""JSON Schema files of the planner's documents, generated from the dataclasses.

``python -m planner.schemas`` rewrites them; a test checks they are current.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from planner.artifacts import cluster, plan, profile, report
from planner.artifacts.json_schema import document_schema

HERE = Path(__file__).parent


def documents() -> dict[str, tuple[int, dict[str, Any]]]:
    """Document name -> (version, JSON Schema)."""
    return {
        "profile": (profile.VERSION, document_schema(profile.Profile, profile.SCHEMA, profile.VERSION)),
        "cluster": (cluster.VERSION, document_schema(cluster.Cluster, cluster.SCHEMA, cluster.VERSION)),
        "plan": (plan.VERSION, plan.plan_schema()),
        "runreport": (report.VERSION, document_schema(report.RunReport, report.SCHEMA, report.VERSION)),
    }


def render() -> dict[str, str]:
    """File name -> text of every schema file."""
    return {f"{name}.v{version}.schema.json": json.dumps(doc, indent=2) + "\n" for name, (version, doc) in documents().items()}


def write() -> list[Path]:
    paths = []
    for fname, text in render().items():
        path = HERE / fname
        path.write_text(text)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in write():
        print(p)
