"""profile_model on real zoo models: exact saved bytes, the layer DAG, tied parameters, fits."""

from __future__ import annotations

import textwrap
import warnings
from pathlib import Path

import pytest
import torch

from planner.artifacts.kinds import DType
from planner.artifacts.profile import profile_from_json, profile_to_json
from planner.commands.cli import main
from planner.graph import cut_bytes_per_sample
from planner.models import load_workload, workload_fingerprint
from planner.models.workload import Workload
from planner.profiling.measured import detect_tied, profile_model
from planner.profiling.measured.fit import fit_time
from planner.profiling.measured.memory import measure_layer_bytes, measure_model_bytes, whole_model_saved_bytes

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "gpt": "gpt:layers=2,hidden=16,heads=2,seq=8,vocab=32",
    "bert": "bert:layers=2,hidden=16,heads=2,seq=8,vocab=32",
    "vgg": "vgg:convs=4,width=4,image=8",
    "resnet": "resnet:blocks=4,width=4,image=8",
}
FAST = dict(microbatch_sizes=(1, 3), warmup=0, repeats=1, progress=False, trace_ops=False)


@pytest.mark.parametrize("name", sorted(TINY))
@pytest.mark.parametrize("batch_size", [1, 3])
def test_layer_saved_bytes_add_up_to_whole_model(name: str, batch_size: int) -> None:
    """Once per storage: the layers' bytes less what two layers share is the model's."""
    workload = load_workload(TINY[name])
    inputs, targets = workload.make_batch(batch_size, 0)
    measured = measure_model_bytes(workload, inputs, targets)
    whole = whole_model_saved_bytes(workload, inputs, targets)
    assert whole > 0
    assert sum(b.saved_bytes for b in measured.layers) - sum(measured.shared.values()) == whole
    assert [b.saved_bytes for b in measured.layers] == [b.saved_bytes for b in measure_layer_bytes(workload, inputs, targets)]
    if name in ("vgg", "resnet"):  # a ReLU keeps its output, the next layer's conv or pool keeps it too
        assert measured.shared


def test_views_and_resaves_count_once() -> None:
    """The q, k and v projections each save the block's normalised input: one storage."""
    workload = load_workload(TINY["gpt"])
    inputs, targets = workload.make_batch(2, 0)
    block = measure_model_bytes(workload, inputs, targets).layers[1].saved_bytes
    per_tensor = []
    x = workload.layers[0](inputs).detach().requires_grad_()
    with torch.autograd.graph.saved_tensors_hooks(lambda t: per_tensor.append(t) or t, lambda t: t):
        workload.layers[1](x)
    params = {p.untyped_storage().data_ptr() for p in workload.layers[1].parameters()}
    naive = sum(t.numel() * t.element_size() for t in per_tensor if t.untyped_storage().data_ptr() not in params)
    ln_out = 2 * 8 * 16 * 4  # batch x seq x hidden float32, saved by q, k and v
    assert naive - block >= 2 * ln_out


@pytest.mark.parametrize("name", sorted(TINY))
def test_profile_saved_bytes_match_one_pass(name: str) -> None:
    workload = load_workload(TINY[name])
    profile = profile_model(workload, **FAST)
    inputs, targets = workload.make_batch(3, 0)
    total = sum(layer.saved_bytes(3) for layer in profile.layers) - sum(p.at(3) for p in profile.shared_saved)
    assert total == pytest.approx(whole_model_saved_bytes(workload, inputs, targets), rel=1e-12)


def test_resnet_dag_has_skip_edges_and_cuts_include_them() -> None:
    workload = load_workload(TINY["resnet"])
    profile = profile_model(workload, **FAST)
    names = profile.layer_names
    edges = {(e.src, e.dst): e.bytes_per_sample for e in profile.edges}
    x, _ = workload.make_batch(1, 0)
    stem_out = workload.layers[0](x)
    h, skip = workload.layers[1](stem_out)
    skip_bytes = skip.numel() * skip.element_size()
    h_bytes = h.numel() * h.element_size()
    a, b = names.index("block0.a"), names.index("block0.b")
    assert edges[(a - 1, b)] == skip_bytes  # the skip edge stem -> block0.b
    assert edges[(a, b)] == h_bytes
    skips = [(s, d) for (s, d) in edges if d > s + 1]
    assert len(skips) == 4  # one per block
    cuts = cut_bytes_per_sample(profile)
    assert cuts[b] == h_bytes + skip_bytes  # a boundary inside the block carries h and the skip
    assert cuts[b] == profile.layers[a].output_bytes_per_sample
    assert cuts[a] == skip_bytes


def test_gpt_profile_records_tied_embedding_and_chain() -> None:
    workload = load_workload(TINY["gpt"])
    profile = profile_model(workload, **FAST)
    (tie,) = profile.tied
    assert tie.layers == (0, profile.num_layers - 1)
    assert tie.param_count == 32 * 16 and tie.param_bytes == 32 * 16 * 4
    assert [(e.src, e.dst) for e in profile.edges] == [(i, i + 1) for i in range(profile.num_layers - 1)]
    assert all(e.bytes_per_sample == 8 * 16 * 4 for e in profile.edges)
    assert detect_tied(load_workload(TINY["bert"])) == ()


def test_profile_contents_and_round_trip() -> None:
    workload = load_workload(TINY["bert"])
    profile = profile_model(workload, microbatch_sizes=(2, 1, 2), warmup=1, repeats=2, num_threads=1, progress=False)
    assert profile.source == "measured" and profile.device == "cpu"
    assert profile.microbatch_sizes == (1, 2)
    assert profile.fingerprint_sha256 == workload_fingerprint(workload)
    assert profile.metadata["torch_num_threads"] == 1 and profile.metadata["clock"] == "perf_counter"
    assert profile.metadata["fx_traced_layers"] == len(workload.layers)
    assert profile.versions["torch"] == torch.__version__
    for layer, module in zip(profile.layers, workload.layers):
        assert [p.microbatch_size for p in layer.measured] == [1, 2]
        assert all(p.fwd_ms > 0 and p.bwd_ms > 0 for p in layer.measured)
        assert layer.param_count == sum(p.numel() for p in module.parameters())
        assert layer.param_bytes == 4 * layer.param_count
    assert profile_from_json(profile_to_json(profile)) == profile


def test_dtype_changes_bytes_not_the_callers_model() -> None:
    workload = load_workload(TINY["vgg"])
    p32 = profile_model(workload, **FAST)
    p64 = profile_model(workload, dtype="float64", **FAST)
    assert all(p.dtype == torch.float32 for m in workload.layers for p in m.parameters())
    for a, b in zip(p32.layers, p64.layers):
        assert b.param_bytes == 2 * a.param_bytes
        assert b.output_bytes_per_sample == 2 * a.output_bytes_per_sample


def test_fit_recovers_a_line_and_stays_valid() -> None:
    fit = fit_time([1, 2, 4], [1.5, 2.0, 3.0])
    assert fit.intercept_ms == pytest.approx(1.0) and fit.per_sample_ms == pytest.approx(0.5)
    flat = fit_time([1, 2, 4], [2.0, 1.9, 1.8])
    assert flat.per_sample_ms == 0.0 and flat.intercept_ms == pytest.approx(1.9)
    single = fit_time([4], [2.0])
    assert single.at(4) == pytest.approx(2.0) and single.intercept_ms == 0.0


class Branchy(torch.nn.Module):
    """Data-dependent control flow: torch.fx cannot trace it."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) if x.sum() > 0 else -self.fc(x)


def test_untraceable_layer_stays_a_module_and_warns_only_when_verbose() -> None:
    workload = Workload(
        name="branchy",
        layers=(torch.nn.Linear(4, 4), Branchy()),
        layer_names=("first", "branchy"),
        make_batch=lambda b, s: (torch.randn(b, 4, generator=torch.Generator().manual_seed(s)), torch.zeros(b, dtype=torch.long)),
        loss_fn=torch.nn.functional.cross_entropy,
    )
    with pytest.warns(UserWarning, match=r"layer 'branchy' \(Branchy\) cannot be traced"):
        profile = profile_model(workload, microbatch_sizes=(1,), warmup=0, repeats=1, progress=False, verbose=True)
    assert profile.metadata["fx_untraced_layers"] == "branchy"
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # issue 51: no torch.fx line by default
        quiet = profile_model(workload, microbatch_sizes=(1,), warmup=0, repeats=1, progress=False)
    assert quiet.metadata["fx_untraced_layers"] == "branchy"
    assert profile.num_layers == 2


def test_bad_profile_arguments() -> None:
    from planner.artifacts.errors import PlannerInputError

    workload = load_workload(TINY["vgg"])
    for kwargs in ({"microbatch_sizes": (0,)}, {"dtype": "int8"}, {"device": "tpu"}, {"repeats": 0}):
        with pytest.raises(PlannerInputError):
            profile_model(workload, progress=False, **kwargs)


FACTORY = textwrap.dedent(
    """
    import torch
    def boom():
        raise RuntimeError("factory failed")
    def wrong():
        return 42
    """
)


@pytest.mark.parametrize(
    "spec, words",
    [
        ("no_such_module_abc:make", "cannot import 'no_such_module_abc'"),
        ("cli_factories_for_test:boom", "factory raised RuntimeError: factory failed"),
        ("cli_factories_for_test:wrong", "factory returned int"),
        ("gpt:width=3", "unknown option 'width'"),
    ],
)
def test_cli_bad_model_spec_exits_2_with_one_line(spec: str, words: str, tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "cli_factories_for_test.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    code = main(["profile", "--model", spec, "--out", str(tmp_path / "p.json")])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and words in err and err.startswith("planner profile: error:")
    assert not (tmp_path / "p.json").exists()


def test_cli_profile_writes_a_loadable_profile(tmp_path: Path) -> None:
    """``planner profile`` (its ``main``, in this process: the command as a fresh interpreter runs
    it is run by tests/test_first_hour.py and the README's test; a bad module spec's one line by
    test_cli_bad_model_spec_exits_2_with_one_line) writes a profile that loads."""
    out = tmp_path / "resnet.json"
    assert main(["profile", "--model", TINY["resnet"], "--microbatch-sizes", "1,2", "--warmup", "0", "--repeats", "1",
                 "--threads", "1", "--no-progress", "--out", str(out)]) == 0
    from planner.artifacts.profile import load_profile

    profile = load_profile(out)
    assert profile.model == "resnet" and profile.microbatch_sizes == (1, 2)


@pytest.mark.parametrize("name", ["resnet", "gpt"])
def test_layer_by_layer_backward_gives_whole_model_gradients(name: str) -> None:
    """The timed step, cut at layer boundaries, computes the same gradients as one backward."""
    from planner.profiling.measured.timing import Clock, time_layers

    workload = load_workload(TINY[name], dtype="float64")
    inputs, targets = workload.make_batch(2, 0)
    times = time_layers(workload.layers, inputs, lambda out: workload.loss_fn(out, targets), Clock(torch.device("cpu")),
                        warmup=0, repeats=1)
    assert len(times) == len(workload.layers) and all(t.fwd_ms > 0 and t.bwd_ms > 0 for t in times)
    params = [p for layer in workload.layers for p in layer.parameters()]
    chained = [p.grad.clone() for p in params]
    for p in params:
        p.grad = None
    out = inputs
    for layer in workload.layers:
        out = layer(out)
    workload.loss_fn(out, targets).backward()
    for got, p in zip(chained, params):
        torch.testing.assert_close(got, p.grad, rtol=1e-10, atol=1e-12)


SHIPPED = [*("gpt", "bert", "vgg", "resnet", "moe"), pytest.param("gpt2", marks=pytest.mark.hf)]


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_zoo_profiles_match_the_zoo_and_plan(name: str, tmp_path: Path) -> None:
    """profiles/zoo-<name>-cpu.json is a profile of today's default zoo model, it records what W
    keeps as the profiler measures it today (``benchmarks/make_profiles.py --refresh-keep``), and
    it plans."""
    from planner.artifacts.profile import load_profile
    from planner.profiling.measured.profiler import BATCH_SEED
    from planner.profiling.measured.wgrad import weight_grad_saved_fractions

    path = REPO / "profiles" / f"zoo-{name}-cpu.json"
    profile = load_profile(path)
    assert profile.source == "measured" and profile.device == "cpu"
    work = load_workload(name)
    assert profile.fingerprint_sha256 == workload_fingerprint(work)
    inputs, targets = work.make_batch(int(profile.metadata["bytes_measured_at_microbatch_size"]), BATCH_SEED)
    kept = weight_grad_saved_fractions(work, inputs, targets)
    assert [layer.weight_grad_saved_fraction for layer in profile.layers] == pytest.approx(kept, rel=1e-12), name
    assert kept[-1] < 1.0  # the head's (and loss's) tail is freed at I
    assert {"torch_num_threads", "clock"} <= set(profile.metadata) and "torch" in profile.versions
    assert path.stat().st_size < 200_000
    args = ["plan", "--profile", str(path), "--cluster", "local-cpu", "--global-batch", "16", "--out", str(tmp_path / "p.json")]
    assert main(args) == 0


def test_default_dtype_is_the_models_own() -> None:
    profile = profile_model(load_workload(TINY["vgg"] + ",dtype=float64"), **FAST)
    assert profile.dtype is DType.FLOAT64 and profile.layers[0].param_bytes == 8 * profile.layers[0].param_count
