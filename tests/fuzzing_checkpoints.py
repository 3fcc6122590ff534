"""Hostile checkpoint directories (issue 52), shared by tests/test_fuzz.py and
benchmarks/fuzz_loaders.py: the resume path -- the launcher's check
(``planner.runtime.preflight.check_resume``) then the ranks' ``resume_chunks`` -- against a
real directory of two committed steps of a real model (one process, gloo), damaged one way per
mutant. Classes and their oracles:

- ``manifest``: step 2's ``manifest.json`` mutated as tests/fuzzing.py mutates any JSON file;
- ``latest``: the manifests removed and ``latest.json`` mutated (resumed with
  ``--trust-unverified-checkpoint``: the only reading of that file);
- ``flip``: 1-8 bits flipped in a random file of step 2; ``truncate``: it cut short (to 0 bytes
  every fourth time);
- ``flip_no_manifest``: the same flip with the manifests removed, resumed without trust;
- ``special``: a FIFO, a link to ``/dev/zero``, a directory or a socket in place of a manifest,
  ``latest.json`` or a stage file.

Any outcome but these is fine: a resume that loads exactly the tensors saved at the step it
returns (step 2, or step 1 after a warning), or a refusal in one line naming a file of the
directory. A *silent corruption* is a resume that returns a step whose tensors differ from
the ones saved there (or, for ``flip_no_manifest``, any resume at all); a *crash*, a *hang*,
*slow*, a *multi-line* or *unnamed* refusal are as in tests/fuzzing.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import shutil
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from planner.artifacts.errors import PlannerError
from planner.artifacts.kinds import DType
from planner.runtime import checkpoint_files as files
from planner.runtime.checkpoint import CheckpointSlot, resume_chunks, save_chunks
from planner.runtime.checkpoint_settings import run_settings_record
from planner.runtime.emulate import ChunkTimer
from planner.runtime.model import load_workload, workload_fingerprint
from planner.runtime.options import RuntimeOptions
from planner.runtime.preflight import check_resume
from planner.runtime.stage import StageModule
from planner.runtime.stage_helpers import Chunk
from tests.factories import make_plan
from tests.fuzzing import CPU_LIMIT_S, HANG_S, JUNK, Loader, Outcome, _alarm, _Hang, _json_mutant, _Validator

MLP = "tests.factories:mlp"
CLASSES = ("manifest", "latest", "flip", "truncate", "flip_no_manifest", "special")
#: tests/fuzzing.py's JSON mutation classes, one drawn per manifest mutant
JSON_CLASSES = ("truncate", "non_utf8", "bom", "empty", "duplicate_key", "surrogate", "constant", "type_swap", "delete",
                "extra_key", "deep", "long_string", "huge")


def _plan() -> Any:
    workload = load_workload(MLP, 0)
    return make_plan(workload.layer_names, (), fingerprint=workload_fingerprint(workload))


def _chunks(seed: int) -> list[Chunk]:
    torch.manual_seed(seed)
    workload = load_workload(MLP, seed)
    module = StageModule(list(workload.layers), [False] * len(workload.layers)).to(torch.float64)
    opt = torch.optim.SGD(module.parameters(), lr=0.1)
    return [Chunk(stage_plan=_plan().stages[0], module=module, timer=ChunkTimer(), optimizer=opt)]


def _settings() -> dict[str, Any]:
    return run_settings_record(RuntimeOptions(plan_path="p", model_spec=MLP, dtype=DType.FLOAT64, lr=0.1), _plan())


@dataclasses.dataclass
class Base:
    """A directory with steps 1 and 2 committed, and the state each step holds."""

    root: Path
    states: dict[int, dict[str, torch.Tensor]]


def make_base(folder: Path) -> Base:
    """Save steps 1 and 2 (different weights) under ``folder / "base"`` (needs a process group)."""
    root = folder / "base"
    states = {}
    for step in (1, 2):
        chunks = _chunks(seed=step)
        save_chunks(str(root), chunks, CheckpointSlot(), step, settings=_settings(), keep_last=0)
        states[step] = {k: v.clone() for k, v in chunks[0].module.state_dict().items()}
    return Base(root=root, states=states)


@dataclasses.dataclass(frozen=True)
class DirMutant:
    kind: str
    variant: str
    trust: bool = False


def _flip(path: Path, rng: random.Random) -> None:
    data = bytearray(path.read_bytes())
    for _ in range(rng.randint(1, 8)):
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
    path.write_bytes(bytes(data))


def _special(path: Path, kind: str, keep: list[Any]) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev_zero":
        path.symlink_to("/dev/zero")
    elif kind == "directory":
        path.mkdir()
    else:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.bind(str(path))
        keep.append(sock)


def _unmanifest(root: Path) -> None:
    for manifest in root.glob("step_*/manifest.json"):
        manifest.unlink()


def mutate(base: Base, root: Path, kind: str, rng: random.Random, index: int, keep: list[Any]) -> DirMutant:
    """Copy the base directory to ``root`` and damage it one way of ``kind``."""
    shutil.copytree(base.root, root)
    (root / files.LOCK).unlink(missing_ok=True)
    stage = root / "step_2" / "stage_0.pt"
    if kind == "manifest":
        text = (root / "step_2" / "manifest.json").read_text()
        loader = Loader(name="manifest", text=text, load=lambda p: None)
        mutant = _json_mutant(rng.choice(JSON_CLASSES), loader, json.loads(text), _Validator(None), rng)
        (root / "step_2" / "manifest.json").write_bytes(mutant.data)
        return DirMutant(kind, mutant.kind)
    if kind == "latest":
        _unmanifest(root)
        doc: Any = rng.choice([{"completed_steps": rng.choice(JUNK + (1, 2, 3, -1, 2**70))}, rng.choice(JUNK)])
        text = json.dumps(doc) if rng.random() < 0.8 else rng.choice(["", "{", "\ud800", "{\"completed_steps\": NaN}"])
        (root / files.LATEST).write_bytes(text.encode("utf-8", "surrogatepass"))
        return DirMutant(kind, text[:40], trust=True)
    if kind in ("flip", "flip_no_manifest"):
        _flip(stage, rng)
        if kind == "flip_no_manifest":
            _unmanifest(root)
        return DirMutant(kind, "stage_0.pt")
    if kind == "truncate":
        data = stage.read_bytes()
        stage.write_bytes(data[: 0 if index % 4 == 0 else rng.randrange(len(data))])
        return DirMutant(kind, "stage_0.pt")
    what = rng.choice(["fifo", "dev_zero", "directory", "socket"])
    where = rng.choice(["manifest", "latest", "stage"])
    target = {"manifest": root / "step_2" / "manifest.json", "latest": root / files.LATEST, "stage": stage}[where]
    if where == "latest":
        _unmanifest(root)
    _special(target, what, keep)
    return DirMutant(kind, f"{what} as {where}", trust=where == "latest")


def resume(root: Path, trust: bool) -> tuple[int, dict[str, torch.Tensor]]:
    """The launcher's check, then the rank's resume: (step, the tensors loaded)."""
    check_resume(_plan(), str(root), settings=_settings(), num_steps=5, allowed=(), trust_unverified=trust)
    chunks = _chunks(seed=99)
    step = resume_chunks(str(root), chunks, CheckpointSlot(), settings=_settings(), num_steps=5, trust_unverified=trust)
    return step, chunks[0].module.state_dict()


def run_dir_mutant(base: Base, root: Path, mutant: DirMutant) -> Outcome:
    """Resume ``root`` and classify (see the module docstring)."""
    cpu = time.process_time()
    try:
        with _alarm(HANG_S), contextlib.redirect_stderr(open(os.devnull, "w")):
            step, loaded = resume(root, mutant.trust)
    except _Hang:
        return Outcome(f"hang: more than {HANG_S} s", False, time.process_time() - cpu)
    except PlannerError as exc:
        used = time.process_time() - cpu
        text = str(exc)
        if "\n" in text:
            return Outcome(f"multi-line message: {text[:200]!r}", True, used)
        if str(root) not in text:
            return Outcome(f"message does not name the file: {text[:200]!r}", True, used)
        return Outcome("" if used <= CPU_LIMIT_S else f"slow refusal: {used:.1f} s CPU", True, used)
    except BaseException as exc:
        return Outcome(f"crash: {type(exc).__name__}: {str(exc)[:200]}", False, time.process_time() - cpu)
    used = time.process_time() - cpu
    if mutant.kind == "flip_no_manifest":
        return Outcome(f"silent acceptance: step {step} loaded unverified", False, used)
    expected = base.states.get(step)
    if expected is None or any(not torch.equal(loaded[k], v) for k, v in expected.items()):
        return Outcome(f"silent corruption: step {step} loaded tensors it did not save", False, used)
    return Outcome("" if used <= CPU_LIMIT_S else f"slow: {used:.1f} s CPU", False, used)


def run_dir_mutants(base: Base, folder: Path, count: int, seed: int) -> Iterator[tuple[DirMutant, Outcome]]:
    """``count`` mutants cycling through :data:`CLASSES`, each in its own copy of the base."""
    rng = random.Random(seed)
    for i in range(count):
        keep: list[Any] = []
        root = folder / f"c{i}"
        try:
            mutant = mutate(base, root, CLASSES[i % len(CLASSES)], rng, i, keep)
            yield mutant, run_dir_mutant(base, root, mutant)
        finally:
            for sock in keep:
                sock.close()
            shutil.rmtree(root, ignore_errors=True)
