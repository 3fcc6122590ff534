"""PipeDream graph.txt import: graphs in its format that the project writes (tests/graph_fixtures.py:
a chain, a residual graph, an LSTM encoder-decoder with tuples and three inputs), and malformed
files. PipeDream's 14 published profiles are read from ``../shared/reference/pipedream`` by
``benchmarks/pipedream_profiles.py``, not by tests."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from planner.artifacts.codec import dumps_canonical
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.profile import load_profile, profile_to_json
from planner.commands.cli import main
from planner.graph import cut_bytes_per_sample
from planner.profiling.imported.pipedream import import_pipedream, infer_batch_size, parse_graph
from tests.graph_fixtures import FP32, GRAPHS, HIDDEN, SEQ, graph_path, graph_text

FIXTURES = tuple(GRAPHS)  # graph.txt files the project writes itself (tests/graph_fixtures.py)


def test_fixtures_are_what_the_generator_writes() -> None:
    """The committed graphs are tests/graph_fixtures.py's output (regenerate with ``python -m
    tests.graph_fixtures --write``)."""
    for name in FIXTURES:
        assert graph_path(name).read_text() == graph_text(name), name


@pytest.mark.parametrize("model", FIXTURES)
def test_import_matches_the_written_graph_and_round_trips(model: str, tmp_path: Path) -> None:
    path = graph_path(model)
    written = GRAPHS[model][0]()
    graph = parse_graph(path)
    assert graph.counts() == (len(written.nodes), len(written.edges))
    profile = import_pipedream(path)
    assert profile.model == model and profile.source == "pipedream"
    assert (profile.metadata["raw_nodes"], profile.metadata["raw_edges"]) == graph.counts()
    assert infer_batch_size(graph) == written.batch
    batch = profile.microbatch_sizes[0]
    assert batch == written.batch
    # inputs merged into a zero-cost layer 0; every other node is one layer
    inputs = [n for n in graph.nodes if n.is_input]
    first = profile.layers[0]
    assert first.name == "input" and first.fwd_ms(batch) == 0 and first.bwd_ms(batch) == 0
    assert profile.num_layers == len(graph.nodes) - len(inputs) + 1 - profile.metadata["dropped_getitem_sinks"]
    by_id = {n.node_id: n for n in graph.nodes}
    for layer in profile.layers[1:]:
        node = by_id[layer.name]
        assert layer.fwd_ms(batch) == pytest.approx(node.fwd_ms)
        assert layer.bwd_ms(batch) == pytest.approx(node.bwd_ms)
        assert layer.output_bytes_per_sample * batch == pytest.approx(node.activation_bytes)
        assert layer.param_bytes == round(node.param_bytes)
    assert all(e.src < e.dst for e in profile.edges)  # a topological order (resnet's lines are reversed)
    cuts = cut_bytes_per_sample(profile)
    assert (cuts[1:-1] > 0).all() or model == "seq2seq"  # its inputs weigh nothing
    saved = tmp_path / f"{model}.json"
    assert main(["import-pipedream", str(path), "--out", str(saved)]) == 0
    assert load_profile(saved) == profile
    assert dumps_canonical(profile_to_json(import_pipedream(path))) == saved.read_text()  # deterministic


def test_residual_joins_and_the_size_view_side_branch() -> None:
    """resnet: every block's ``Add`` joins two producers, the skip edge jumping over the block;
    cnn: a chain but for ``Size -> View``."""
    resnet = import_pipedream(graph_path("resnet"))
    kinds = {n.node_id: n.kind for n in parse_graph(graph_path("resnet")).nodes}
    adds = [i for i, layer in enumerate(resnet.layers) if kinds.get(layer.name) == "Add"]
    assert len(adds) == 8
    for i in adds:
        producers = sorted(e.src for e in resnet.edges if e.dst == i)
        assert len(producers) == 2 and i - producers[0] > 2, producers
    cnn = parse_graph(graph_path("cnn"))
    fan_out = {src for src, _ in cnn.edges if sum(1 for s, _ in cnn.edges if s == src) > 1}
    assert [n.kind for n in cnn.nodes if n.node_id in fan_out] == ["MaxPool2d"]


def test_seq2seq_tuples_and_getitem_sinks() -> None:
    """Three inputs of size 0 (batch from the first LSTM's h_n), LSTM outputs ``[out; h_n; c_n]``,
    the unused ``__getitem__(1)`` of each of the 6 LSTMs dropped."""
    graph = parse_graph(graph_path("seq2seq"))
    lstm = next(n for n in graph.nodes if n.kind == "LSTM")
    out, state = FP32 * SEQ * HIDDEN * 64, FP32 * HIDDEN * 64
    assert lstm.activation_parts_bytes == (out, state, state)
    assert infer_batch_size(graph) == 64
    profile = import_pipedream(graph_path("seq2seq"))
    assert profile.metadata["merged_inputs"] == 3 and profile.metadata["dropped_getitem_sinks"] == 6
    assert profile.layers[profile.layer_names.index(lstm.node_id)].output_bytes_per_sample == (out + 2 * state) / 64
    assert import_pipedream(graph_path("seq2seq"), batch_size=128).layers[1].fwd.per_sample_ms == pytest.approx(
        profile.layers[1].fwd.per_sample_ms / 2
    )


GOOD = (
    "node1 -- Input -- forward_compute_time=5.0, backward_compute_time=0.000, activation_size=1204224.0, parameter_size=0.000\n"
    "node2 -- Conv2d(3, 8) -- forward_compute_time=2.0, backward_compute_time=4.0, activation_size=[64.0; 64.0], parameter_size=16.0\n"
    "node3 -- __getitem__(0) -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=64.0, parameter_size=0.0\n"
    "node4 -- ReLU -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=32.0, parameter_size=0.0\n"
    "\tnode1 -- node2\n"
    "\tnode2 -- node4\n"
    "\tnode2 -- node3\n"
)


def test_small_graph_converts(tmp_path: Path) -> None:
    path = tmp_path / "graph.txt"
    path.write_text(GOOD)
    profile = import_pipedream(path)
    assert profile.microbatch_sizes == (2,)  # 1204224 bytes = 2 fp32 224x224 RGB images
    assert profile.layer_names == ("input", "node2", "node4")
    assert profile.metadata["dropped_getitem_sinks"] == 1
    assert profile.layers[1].param_count == 4 and profile.layers[1].output_bytes_per_sample == 64.0
    assert profile.layers[1].input_bytes_per_sample == 1204224.0 / 2
    assert [(e.src, e.dst, e.bytes_per_sample) for e in profile.edges] == [(0, 1, 602112.0), (1, 2, 64.0)]


@pytest.mark.parametrize(
    "text, words",
    [
        (GOOD.replace("node2 -- Conv2d(3, 8) -- ", "node2 Conv2d "), "graph.txt:2: expected 'nodeN"),
        (GOOD.replace("forward_compute_time=1.0", "forward_compute_time=abc"), "graph.txt:4: forward_compute_time is not a number"),
        (GOOD.replace(", parameter_size=0.0\n\t", "\n\t"), "graph.txt:4: node node4 lacks parameter_size"),
        (GOOD + "\tnode4 -- node9\n", "graph.txt:8: edge names unknown node node9"),
        (GOOD + "\tnode4 -- \n", "graph.txt:8: expected an edge"),
        (GOOD.replace("node3 --", "node2 --", 1), "graph.txt:3: node node2 is defined twice"),
        (GOOD + "\tnode4 -- node2\n", "graph.txt: the graph has a cycle"),
        ("", "graph.txt: no nodes"),
        (GOOD.replace("activation_size=1204224.0", "activation_size=1000.0"), "cannot infer the batch size"),
        (GOOD.replace("activation_size=32.0", "activation_size=-3"), "graph.txt:4: activation_size must be finite"),
    ],
)
def test_malformed_files_name_file_and_line(text: str, words: str, tmp_path: Path, capsys) -> None:
    path = tmp_path / "graph.txt"
    path.write_text(text)
    with pytest.raises(PlannerInputError, match=re.escape(words)):
        import_pipedream(path)
    assert main(["import-pipedream", str(path), "--out", str(tmp_path / "out.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and str(path) in err


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(PlannerInputError, match=r"nope\.txt: no such file"):
        import_pipedream(tmp_path / "nope.txt")


@pytest.mark.parametrize("model", ["cnn", "seq2seq"])
def test_imported_profile_plans(model: str, tmp_path: Path) -> None:
    profile_path, plan_path = tmp_path / "p.json", tmp_path / "plan.json"
    assert main(["import-pipedream", str(graph_path(model)), "--out", str(profile_path)]) == 0
    assert main(["plan", "--profile", str(profile_path), "--devices", "4", "--out", str(plan_path)]) == 0
    assert plan_path.exists()


def test_importer_and_cli_modules_do_not_import_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys, planner, planner.profiling.imported.pipedream, planner.commands.profile, "
        "planner.commands.import_pipedream, planner.commands.cli; planner.commands.cli.build_parser(); "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_plan_takes_a_graph_txt_as_its_profile(tmp_path: Path, capsys) -> None:
    """``planner plan --profile graph.txt`` plans what import-pipedream's JSON plans, byte for byte."""
    graph = graph_path("cnn")
    common = ["--cluster", "v100-16gb-2x8", "--devices", "4", "--global-batch", "1024"]
    assert main(["import-pipedream", str(graph), "--out", str(tmp_path / "cnn.json")]) == 0
    assert main(["plan", "--profile", str(tmp_path / "cnn.json"), *common, "--out", str(tmp_path / "a.json")]) == 0
    assert main(["plan", "--profile", str(graph), *common, "--out", str(tmp_path / "b.json")]) == 0
    assert (tmp_path / "a.json").read_bytes() == (tmp_path / "b.json").read_bytes()
    bad = tmp_path / "graph.txt"
    bad.write_text(GOOD.replace("forward_compute_time=1.0", "forward_compute_time=abc"))
    assert main(["plan", "--profile", str(bad)]) == 2
    assert "graph.txt:4: forward_compute_time is not a number" in capsys.readouterr().err


# ---------------------------------------------------------------- issue 52: a graph that cannot be whole
# On 8607f8e (before issue 52) each of these converted with exit 0 ("24 nodes, 0 edges -> 14 layers").


@pytest.mark.parametrize("cut", ["edgeless", "truncated", "zero_times"])
def test_a_cut_or_timeless_graph_is_refused(cut: str, tmp_path: Path, capsys) -> None:
    lines = graph_path("cnn").read_text().splitlines(keepends=True)
    nodes = [ln for ln in lines if not ln.startswith("\t")]
    edges = [ln for ln in lines if ln.startswith("\t")]
    if cut == "edgeless":
        text, words = "".join(nodes), "23 nodes but no edge lines"
    elif cut == "truncated":  # the file cut in its edge lines: the later nodes lose their producers
        text, words = "".join(nodes + edges[: len(edges) // 2]), "has no producer and is no Input"
    else:
        text = re.sub(r"(forward|backward)_compute_time=[0-9.e+-]+", r"\1_compute_time=0.0", "".join(lines))
        words = "every node's forward_compute_time and backward_compute_time is 0"
    path = tmp_path / "graph.txt"
    path.write_text(text)
    assert main(["import-pipedream", str(path), "--out", str(tmp_path / "p.json")]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and str(path) in err and words in err, err
