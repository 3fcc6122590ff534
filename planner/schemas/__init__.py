"""JSON Schema files of the planner's documents, generated from the dataclasses.

``python -m planner.schemas`` rewrites them; a test checks they are current.
"""

from __future__ import annotations

import json
from pathlib import Path

from planner.artifacts import codec

HERE = Path(__file__).parent


def documents() -> dict[str, tuple[type, str, int]]:
    from planner.artifacts import cluster, plan, profile

    docs = {
        "profile": (profile.Profile, profile.SCHEMA, profile.VERSION),
        "cluster": (cluster.Cluster, cluster.SCHEMA, cluster.VERSION),
        "plan": (plan.Plan, plan.SCHEMA, plan.VERSION),
    }
    try:
        from planner.artifacts import report

        docs["runreport"] = (report.RunReport, report.SCHEMA, report.VERSION)
    except (ImportError, AttributeError):
        pass
    return docs


def render() -> dict[str, str]:
    """File name -> text of every schema file."""
    out = {}
    for name, (cls, schema, version) in documents().items():
        text = json.dumps(codec.document_schema(cls, schema, version), indent=2) + "\n"
        out[f"{name}.v{version}.schema.json"] = text
    return out


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
