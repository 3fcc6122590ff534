"""Hugging Face configs in (planner.models.hf) and analytic Llama profiles (planner.profiling.analytic.llama).

Small configs of each supported architecture are built from transformers with random weights
(no network): the planner's layer chain must compute exactly what the model's own forward
computes, its profile must account for every parameter and saved byte, and it must plan.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip(
    "transformers", reason="needs transformers: pip install -e '.[hf]' (CI installs it and runs these)"
)

from planner.artifacts.errors import PlannerInputError
from planner.commands.cli import main
from planner.models import hf, load_workload, workload_fingerprint
from planner.models.common import seeded
from planner.models.flops import block_fwd_flops
from planner.profiling.analytic.llama import flops_per_token, llama_profile, llama_shape, read_config
from planner.profiling.measured import profile_model
from planner.profiling.measured.memory import whole_model_saved_bytes

ROOT = Path(__file__).resolve().parents[1]
LLAMA3_8B = ROOT / "configs" / "llama-3-8b.json"
TINY = "layers=2,hidden=32,heads=4,intermediate=64,vocab=64,seq=16"
SPECS = {
    "llama": f"hf:llama:{TINY},kv_heads=2",  # grouped-query attention: 2 key/value heads for 4
    "llama-tied": f"hf:llama:{TINY},kv_heads=1,tie_word_embeddings=true",
    "mistral": f"hf:mistral:{TINY},kv_heads=2,sliding_window=8",  # the window cuts the 16 tokens
    "qwen2": f"hf:qwen2:{TINY},kv_heads=2,use_sliding_window=true,sliding_window=4,max_window_layers=1",
    "gpt2": "hf:gpt2:layers=2,hidden=32,heads=4,vocab=64,seq=16",
    "bert": f"hf:bert:{TINY}",
    "t5": "hf:t5:layers=2,hidden=32,heads=4,d_kv=8,d_ff=64,vocab=64,seq=16",  # encoder-decoder
}
TIED = {"llama-tied", "gpt2", "bert"}
T5_NAMES = ("embed", "enc_block_0", "enc_block_1", "enc_norm", "dec_embed", "dec_block_0", "dec_block_1", "dec_norm", "head")


def hf_model(spec: str) -> torch.nn.Module:
    """The same model as transformers builds it whole (same config, same seed)."""
    parsed = hf.parse_spec(spec.removeprefix("hf:"), spec)
    config = hf.make_config(parsed, spec)
    with seeded(parsed.seed):
        return getattr(transformers, hf.FAMILIES[config.model_type].auto_class).from_config(config).double()


def chain(workload, inputs):
    x = inputs
    for layer in workload.layers:
        x = layer(x)
    return x


@pytest.mark.parametrize("name", sorted(SPECS))
def test_layers_compute_the_models_forward(name: str) -> None:
    spec = SPECS[name]
    work = load_workload(spec, dtype="float64")
    model = hf_model(spec)
    inputs, labels = work.make_batch(4, 3)
    ours = chain(work, inputs)
    if name == "t5":  # source ids and mask, decoder ids (the shifted target) and mask
        src, src_mask, dec, mask = inputs
        ref = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec, decoder_attention_mask=mask)
        assert (src_mask == 0).any() and (mask == 0).any()
        real = mask.bool()  # to rounding: each block recomputes the relative bias HF computes once
        torch.testing.assert_close(ours[real], ref.logits[real], rtol=1e-13, atol=1e-13)
        total, count = work.loss_fn(ours, labels)  # T5's own loss is the same token mean
        hf_loss = model(input_ids=src, attention_mask=src_mask, decoder_input_ids=dec, decoder_attention_mask=mask,
                        labels=labels).loss
        assert float((total / count - hf_loss).detach().abs()) < 1e-14
        assert work.layer_names == T5_NAMES
        # the shared embedding (encoder, decoder, head) and each stack's relative position bias
        assert sorted(tuple(i for i, _ in g) for g in work.tied) == [(0, 4, 8), (1, 2), (5, 6)]
        return
    ids, mask = inputs
    assert ids.dtype == mask.dtype == labels.dtype == torch.int64 and (mask == 0).any()  # some samples padded
    ref = model(input_ids=ids, attention_mask=mask).logits  # a ModelOutput
    real = mask.bool()
    assert torch.equal(ours[real], ref[real])
    names = work.layer_names
    assert names[0] == "embed" and names[-1] == "head" and names[1:3] == ("block_0", "block_1")
    assert ("norm" in names) == (name != "bert")  # BERT is post-norm: no final norm
    assert (len(work.tied) == 1) == (name in TIED)
    # every parameter of the model is in exactly one layer (ties: one object, several layers)
    ours_ids = {id(p) for layer in work.layers for p in layer.parameters()}
    assert len(ours_ids) == len(list(hf_model(spec).parameters()))
    total, count = work.loss_fn(ours, labels)
    loss = total / count
    loss.backward()
    assert torch.isfinite(loss) and all(p.grad is not None for layer in work.layers for p in layer.parameters())


def test_padding_mask_reaches_every_block() -> None:
    """Bidirectional BERT: what sits in the padded positions must not change a real token."""
    work = load_workload(SPECS["bert"], dtype="float64")
    (ids, mask), _ = work.make_batch(4, 0)
    other = torch.where(mask.bool(), ids, (ids + 7) % 64)
    real = mask.bool()
    assert torch.equal(chain(work, (ids, mask))[real], chain(work, (other, mask))[real])
    assert not torch.equal(chain(work, (ids, torch.ones_like(mask)))[real], chain(work, (ids, mask))[real])


def test_loss_is_hfs_token_mean_as_sum_and_count() -> None:
    """(sum, count) over micro-batches with different numbers of real tokens = the token mean
    of the whole batch, which is F.cross_entropy's mean over the labelled tokens."""
    for name in ("llama", "bert"):
        work = load_workload(SPECS[name], dtype="float64")
        inputs, labels = work.make_batch(6, 1)
        logits = chain(work, inputs)
        total, count = work.loss_fn(logits, labels)
        mean = torch.nn.functional.cross_entropy(logits.reshape(-1, 64), labels.reshape(-1), ignore_index=-100)
        assert float(((total / count) - mean).abs().detach()) < 1e-15
        parts = [work.loss_fn(chain(work, (inputs[0][i : i + 2], inputs[1][i : i + 2])), labels[i : i + 2]) for i in (0, 2, 4)]
        assert len({int(c) for _, c in parts}) > 1  # the micro-batches differ in real tokens
        assert float((sum(t for t, _ in parts) / sum(c for _, c in parts) - mean).abs().detach()) < 1e-14
        assert all(int(c) > 0 for _, c in parts)


@pytest.mark.parametrize("name", ["llama", "gpt2", "bert", "t5"])
def test_profile_accounts_for_every_parameter_and_saved_byte(name: str, tmp_path: Path) -> None:
    spec = SPECS[name]
    work = load_workload(spec)
    profile = profile_model(work, microbatch_sizes=(1, 2), warmup=0, repeats=1, progress=False, trace_ops=False)
    assert profile.layer_names == work.layer_names and profile.model == f"hf-{spec.split(':')[1]}"
    unique = sum(p.numel() * p.element_size() for p in hf_model(spec).float().parameters())
    assert sum(layer.param_bytes for layer in profile.layers) - sum(t.param_bytes * (len(t.layers) - 1) for t in profile.tied) == unique
    inputs, targets = work.make_batch(2, 0)
    total = sum(layer.saved_bytes(2) for layer in profile.layers) - sum(p.at(2) for p in profile.shared_saved)
    assert total == whole_model_saved_bytes(work, inputs, targets)
    # the padding mask (int64, 8 bytes a token) travels from the embedding to every block
    assert {(e.src, e.dst) for e in profile.edges} >= {(0, 1), (0, 2)}
    if name == "t5":  # the encoder output (made by enc_norm) is read by every decoder block
        assert {(e.src, e.dst) for e in profile.edges} >= {(3, 5), (3, 6), (3, 7)}
    assert profile.metadata["option.model_type"] == spec.split(":")[1]
    assert profile.fingerprint_sha256 == workload_fingerprint(work)
    path = tmp_path / "p.json"
    from planner.artifacts.profile import save_profile

    save_profile(profile, path)
    assert main(["plan", "--profile", str(path), "--cluster", "local-cpu", "--devices", "2", "--global-batch", "8",
                 "--out", str(tmp_path / "plan.json")]) == 0


def test_config_file_directory_and_inline_agree(tmp_path: Path) -> None:
    fields = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 32, "num_attention_heads": 4,
              "num_key_value_heads": 2, "intermediate_size": 64, "vocab_size": 64, "rope_theta": 10000.0,
              "architectures": ["LlamaForCausalLM"], "_source": "a note"}
    (tmp_path / "config.json").write_text(json.dumps(fields))
    prints = {workload_fingerprint(load_workload(s)) for s in
              (f"hf:{tmp_path}:seq=16", f"hf:{tmp_path / 'config.json'}:seq=16", SPECS["llama"])}
    assert len(prints) == 1
    # the published Llama-3-8B config, shrunk by overrides; its rotary base is the config's
    work = load_workload(f"hf:{LLAMA3_8B}:layers=1,hidden=64,heads=4,intermediate=96,vocab=128,seq=8")
    assert work.layers[1].rotary.config.rope_parameters["rope_theta"] == 500000.0
    assert work.options["kv_heads"] == 8 and work.options["source"] == str(LLAMA3_8B)


@pytest.mark.parametrize(
    "spec, message",
    [
        ("hf:bart", "encoder-decoder other than t5: every decoder block's cross-attention needs the encoder's final output"),
        ("hf:resnet", "no adapter for this architecture"),
        ("hf:nonsense", "model_type 'nonsense' is not supported: no adapter for this architecture"),
        ("hf:llama:hidden_sizes=64", "llama config has no field 'hidden_sizes'"),
        ("hf:gpt2:seq=2048", "exceeds the model's max_position_embeddings (1024)"),
        ("hf:llama:seq=0", "'seq' must be a positive integer"),
        ("hf:llama:layers", "is not key=value"),
        ("hf:llama:padding=yes", "'padding' must be 0 or 1"),
        ("hf:missing/config.json", "no such file or directory"),
        (f"hf:{ROOT / 'configs' / 'llama-3-70b.json'}", "70,553,706,496 parameters do not fit"),
        ("hf:", "give hf:CONFIG"),
    ],
)
def test_bad_specs_are_refused_clearly(spec: str, message: str) -> None:
    with pytest.raises(PlannerInputError, match=None) as info:
        load_workload(spec)
    assert message in str(info.value)


def test_cli_refuses_bart_with_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["profile", "--model", "hf:bart", "--out", "/dev/null"]) == 2
    assert "encoder-decoder" in capsys.readouterr().err


# ---------------------------------------------------------------- analytic Llama profiles

PUBLISHED = {"llama-3-8b": 8.03e9, "llama-3-70b": 70.6e9}  # Dubey et al. 2024 ("The Llama 3 Herd of Models")


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_llama3_parameter_count_is_the_published_size(name: str) -> None:
    config = read_config(ROOT / "configs" / f"{name}.json")
    profile = llama_profile(config, device_preset="h100-80gb", model=name)
    total = sum(layer.param_count for layer in profile.layers) - sum(t.param_count for t in profile.tied)
    assert abs(total / PUBLISHED[name] - 1) < 0.005
    # ... and exactly what transformers builds from the same config (on the meta device)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(hf.make_config(hf.HFSpec(source=name, config=dict(config)), name))
    assert total == sum(p.numel() for p in model.parameters())
    ours, _, ratio = flops_per_token(llama_shape(config))
    assert profile.model_flops_per_sample == pytest.approx(ours * 8192, rel=1e-12)
    assert 0.94 < ratio < 1.0  # below 6N + attention by the embedding lookup's 6 V h


def test_llama_block_flops_reduce_to_narayanans_gpt_block() -> None:
    """With k = a (no GQA) and a SwiGLU width of 8h/3 (three matrices = GPT's two of 4h), a
    Llama block's forward FLOPs are Narayanan et al.'s 24 s h^2 + 4 s^2 h."""
    shape = llama_shape({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 96, "num_attention_heads": 4,
                         "intermediate_size": 256, "vocab_size": 100}, seq=64)
    assert shape.block_fwd_flops() == block_fwd_flops(64, 96)


def test_llama_profile_declares_the_megatron_split() -> None:
    config = read_config(ROOT / "configs" / "llama-3-8b.json")
    profile = llama_profile(config, seq=4096)
    s, h, kv, i, V = 4096, 4096, 1024, 14336, 128256
    block = profile.layers[1].tp
    assert block is not None and block.must_divide == (32, 8) and (block.collectives_fwd, block.collectives_bwd) == (2, 2)
    assert block.split_param_count == profile.layers[1].param_count - 2 * h == 2 * h * h + 2 * h * kv + 3 * h * i
    assert profile.layers[1].saved_bytes_per_sample - block.split_saved_bytes_per_sample == 8 * s * h
    assert block.collective_bytes_per_sample == 2 * s * h
    embed, head = profile.layers[0].tp, profile.layers[-1].tp
    assert embed is not None and (embed.split_param_count, embed.collectives_fwd, embed.collectives_bwd) == (V * h, 1, 0)
    assert head is not None and (head.split_param_count, head.collectives_fwd, head.collectives_bwd) == (V * h, 0, 1)
    assert head.split_saved_bytes_per_sample == 4 * s * V and not profile.tied


def test_cli_analytic_hf(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "l.json"
    assert main(["profile", "--analytic", "hf", "--config", str(LLAMA3_8B), "--seq", "2048",
                 "--device-preset", "a100-80gb", "--out", str(out)]) == 0
    assert "llama-3-8b: 34 layers, 8,030,261,248 parameters" in capsys.readouterr().out
    (tmp_path / "gpt2.json").write_text(json.dumps({"model_type": "gpt2"}))
    assert main(["profile", "--analytic", "hf", "--config", str(tmp_path / "gpt2.json"), "--out", str(out)]) == 2
    assert "has no analytic profile (Llama-style: llama" in capsys.readouterr().err


def test_llama_flop_formulas_count_the_built_models_matmuls() -> None:
    """torch's FlopCounterMode on the transformers block: its matrix multiplies (Q, K, V, O
    projections at GQA widths and the three SwiGLU matrices) are the formula's block FLOPs
    without the attention term 4 s^2 a d; the head's are 2 s h V."""
    from torch.utils.flop_counter import FlopCounterMode

    fields = {"model_type": "llama", "num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 8,
              "num_key_value_heads": 2, "intermediate_size": 96, "vocab_size": 128}
    shape = llama_shape(fields, seq=16)
    work = load_workload("hf:llama:layers=1,hidden=64,heads=8,kv_heads=2,intermediate=96,vocab=128,seq=16")
    x = work.layers[0](work.make_batch(1, 0)[0])
    with FlopCounterMode(display=False) as block:
        y = work.layers[1](x)
    with FlopCounterMode(display=False) as head:
        work.layers[3](work.layers[2](y))
    mm = torch.ops.aten.mm
    assert block.get_flop_counts()["Global"][mm] == shape.block_fwd_flops() - 4 * 16**2 * 8 * 8
    assert head.get_flop_counts()["Global"][mm] == shape.head_fwd_flops()
