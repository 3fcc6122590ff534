"""An ``hf:`` config's non-size values (planner/models/hf_values.py, issue 52 item 6): refused in
one line naming the config, the field and the value, before torch or transformers is imported.

On 8607f8e (before issue 52) ``"rms_norm_eps": null`` and ``"hidden_act": true`` traced back from
inside torch, ``"attention_dropout": 1e308`` was accepted, and ``"rms_norm_eps": -1e35`` was
refused with a tensor-parallel message.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from planner.artifacts.errors import PlannerInputError
from planner.models.hf_spec import parse_spec
from planner.models.hf_values import check_activation_names, check_values
from planner.models.spec import check_spec

ROOT = Path(__file__).resolve().parents[1]
SMALL = "layers=2,hidden=64,heads=4,kv_heads=4,intermediate=128,vocab=128"


def _config(tmp_path: Path, **fields: object) -> Path:
    config = json.loads((ROOT / "configs" / "llama-3-8b.json").read_text())
    config.update(fields)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(("field", "value", "words"), [
    ("rms_norm_eps", None, "rms_norm_eps must be an epsilon: a number in (0, 1] (got null)"),
    ("hidden_act", True, "hidden_act must be an activation function's name"),
    ("attention_dropout", 1e308, "attention_dropout must be a probability: a number in [0, 1] (got 1e+308)"),
    ("rms_norm_eps", -1e35, "rms_norm_eps must be an epsilon: a number in (0, 1] (got -1e+35)"),
    ("tie_word_embeddings", "yes", "tie_word_embeddings must be true or false"),
    ("rope_theta", 0, "rope_theta must be a number in (0, 1e+12]"),
])
def test_a_config_value_out_of_its_family_is_refused_naming_it(tmp_path: Path, field: str, value: object, words: str) -> None:
    path = _config(tmp_path, **{field: value})
    with pytest.raises(PlannerInputError) as info:
        check_spec(f"hf:{path}:{SMALL}")
    message = str(info.value)
    assert words in message and str(path) in message and "\n" not in message, message


def test_an_option_sets_a_value_checked_the_same_way(tmp_path: Path) -> None:
    with pytest.raises(PlannerInputError, match=r"rms_norm_eps must be an epsilon: a number in \(0, 1\] \(got null\)"):
        parse_spec(f"{_config(tmp_path)}:{SMALL},rms_norm_eps=null", "hf:spec")


def test_the_shipped_configs_pass() -> None:
    for path in sorted((ROOT / "configs").glob("*.json")):
        config = json.loads(path.read_text())
        check_values(config, str(path))
        check_activation_names(config, str(path), {"silu", "gelu", "gelu_new", "relu", "gelu_pytorch_tanh"})


def test_an_unknown_activation_is_refused_before_the_model_is_built(tmp_path: Path) -> None:
    pytest.importorskip("transformers")
    from planner.models.hf import make_config

    spec = parse_spec(f"{_config(tmp_path, hidden_act='nope')}:{SMALL}", "hf:spec")
    with pytest.raises(PlannerInputError, match="hidden_act 'nope' is not an activation transformers knows"):
        make_config(spec, "hf:spec")


def test_the_cli_refuses_in_one_line(tmp_path: Path) -> None:
    path = _config(tmp_path, hidden_act=True)
    proc = subprocess.run([sys.executable, "-m", "planner", "profile", "--model", f"hf:{path}:{SMALL}",
                           "--out", str(tmp_path / "p.json")], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}, check=False)
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr[-2000:]
    assert "hidden_act" in proc.stderr and "Traceback" not in proc.stderr
