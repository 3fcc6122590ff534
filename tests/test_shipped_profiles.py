"""Every profile shipped in profiles/ loads, and `planner plan --profile` plans it."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from planner.artifacts.cluster import PRESETS, save_cluster
from planner.artifacts.profile import load_profile
from planner.commands.cli import main

PROFILES = sorted((Path(__file__).resolve().parents[1] / "profiles").glob("*.json"))


def test_profiles_are_shipped():
    names = {p.name for p in PROFILES}
    for size in ("1.3b", "13b", "175b"):
        for gpu in ("a100", "h100"):
            assert f"gpt3-{size}-{gpu}.json" in names
    for size in ("8b", "70b"):
        for gpu in ("a100", "h100"):
            assert f"llama-3-{size}-{gpu}.json" in names
    assert {"zoo-gpt-cpu.json", "zoo-bert-cpu.json", "zoo-vgg-cpu.json", "zoo-resnet-cpu.json"} <= names
    assert "qwen3-235b-a22b-h100.json" in names


@pytest.mark.parametrize("path", PROFILES, ids=[p.stem for p in PROFILES])
def test_plan_every_shipped_profile(path, tmp_path, capsys):
    profile = load_profile(path)
    assert profile.metadata, f"{path.name} has no metadata"
    extra: list[str] = []
    if "cpu" in path.name:
        cluster = "local-cpu"
    else:
        base = PRESETS["h100-80gb-x8" if "h100" in path.name else "a100-80gb-x8"]
        # 175B needs more than one node: 8 nodes of 8; Llama-3-70B 4 nodes, searched at t = 8 with sequence
        # parallelism and micro-batches of 1 only (test time)
        cluster_path = tmp_path / "cluster.json"
        nodes = 8 if "175b" in path.name else 4 if "70b" in path.name else 32 if "235b" in path.name else 1
        save_cluster(dataclasses.replace(base, num_nodes=nodes), cluster_path)
        cluster = str(cluster_path)
        extra = ["--tp", "8", "--sequence-parallel", "on", "--microbatch-sizes", "1"] if "70b" in path.name else []
        if "235b" in path.name:  # Qwen3-235B-A22B: one expert layout and pipeline depth (test time)
            extra = ["--tp", "2", "--cp", "1", "--ep", "32", "--etp", "1", "--stages", "8", "--microbatch-sizes", "1",
                     "--schedules", "gpipe"]
    assert main(["plan", "--profile", str(path), "--cluster", cluster, "--global-batch", "64", *extra]) == 0
    assert "iteration" in capsys.readouterr().out
