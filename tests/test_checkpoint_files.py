"""Checkpoints verified, pruned, locked and compared with the run (issue 22), on real files
and a real one-process gloo group (no torchrun).

Each test failed on the code before issue 22 (commit 38aa3f5): there was no manifest, no
sha256 and no fallback (a flipped bit resumed silently; a truncated newest file was refused
though an older one was intact; a 0-byte file raised a bare ``EOFError``), a failing write
raised ``enforce fail at inline_container.cc`` and left a ``.tmp`` file, nothing was pruned
or locked, and ``--lr``, ``--dtype``, ``--optimizer`` and ``--steps`` were not compared on
resume (the lr ignored, a float64 checkpoint cast, ``KeyError: 'momentum'``, exit 0 for
nothing to train). The functions these tests call did not exist then; where a behaviour had
an older form, the test also checks the message the old code could not give.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily
from planner.artifacts.plan import Plan, save_plan
from planner.commands.cli import main as planner_main
from planner.runtime import checkpoint_files as files
from planner.runtime.checkpoint import CheckpointSlot, choose_step, resume_chunks, save_chunks
from planner.runtime.checkpoint_settings import compare_settings, run_settings_record
from planner.runtime.emulate import ChunkTimer
from planner.runtime.model import load_workload, workload_fingerprint
from planner.runtime.options import RuntimeOptions
from planner.runtime.stage import StageModule
from planner.runtime.stage_helpers import Chunk
from tests.factories import make_plan

ROOT = Path(__file__).resolve().parents[1]
MLP = "tests.factories:mlp"


@pytest.fixture
def group(tmp_path: Path) -> Iterator[None]:
    """A one-process gloo group (the checkpoint functions are collective)."""
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _plan() -> Plan:
    workload = load_workload(MLP, 0)
    return make_plan(workload.layer_names, (), fingerprint=workload_fingerprint(workload))


def _chunks(optimizer: OptimizerFamily = OptimizerFamily.SGD, dtype: torch.dtype = torch.float64, lr: float = 0.1) -> list[Chunk]:
    plan = _plan()
    workload = load_workload(MLP, 0)
    module = StageModule(list(workload.layers), [False] * len(workload.layers)).to(dtype)
    cls = torch.optim.AdamW if optimizer is OptimizerFamily.ADAMW else torch.optim.SGD
    opt = cls(module.parameters(), lr=lr)
    x = torch.randn(4, 8, dtype=dtype)
    module(x).pow(2).mean().backward()
    opt.step()
    return [Chunk(stage_plan=plan.stages[0], module=module, timer=ChunkTimer(), optimizer=opt)]


def _settings(**kw: object) -> dict[str, object]:
    options = RuntimeOptions(plan_path="p", model_spec=MLP, dtype=DType.FLOAT64, lr=0.1, **kw)  # type: ignore[arg-type]
    return run_settings_record(options, _plan())


def _save(root: Path, steps: list[int], keep_last: int = 0, **kw: object) -> list[Chunk]:
    chunks = _chunks(**kw)  # type: ignore[arg-type]
    for k in steps:
        save_chunks(str(root), chunks, CheckpointSlot(), k, settings=_settings(), keep_last=keep_last)
    return chunks


def _stage_file(root: Path, k: int) -> Path:
    return root / f"step_{k}" / "stage_0.pt"


def test_the_manifest_holds_each_files_sha256_and_the_run_settings(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1])
    manifest = files.read_manifest(root, 1)
    record = manifest["files"]["stage_0.pt"]
    import hashlib

    assert record == {"sha256": hashlib.sha256(_stage_file(root, 1).read_bytes()).hexdigest(),
                      "bytes": _stage_file(root, 1).stat().st_size}
    assert manifest["settings"]["lr"] == 0.1 and manifest["settings"]["dtype"] == "float64"
    assert not list(root.rglob("*.tmp"))


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "delete", "manifest"])
def test_a_damaged_newest_step_is_skipped_for_the_newest_intact_one(
    tmp_path: Path, group: None, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1, 2])
    bad = _stage_file(root, 2)
    data = bytearray(bad.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0x01  # one bit of a weight
        bad.write_bytes(bytes(data))
    elif damage == "truncate":
        bad.write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "empty":
        bad.write_bytes(b"")
    elif damage == "delete":
        bad.unlink()
    else:
        bad = root / "step_2" / "manifest.json"
        bad.write_text("{ not json")
    step, _ = choose_step(root, lambda k: [_stage_file(root, k)], torch.device("cpu"))
    assert step == 1
    err = capsys.readouterr().err
    warning = next(line for line in err.splitlines() if "skipping step 2" in line)
    assert str(bad) in warning, err
    cause = {"flip": "corrupt: sha256", "truncate": "truncated", "empty": "empty (0 bytes)", "delete": "missing",
             "manifest": "not valid JSON"}[damage]
    assert cause in warning


def test_resume_from_the_fallback_loads_its_weights_exactly(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    chunks = _chunks()
    save_chunks(str(root), chunks, CheckpointSlot(), 1, settings=_settings())
    saved = {k: v.clone() for k, v in chunks[0].module.state_dict().items()}
    with torch.no_grad():
        for p in chunks[0].module.parameters():
            p.add_(1.0)
    save_chunks(str(root), chunks, CheckpointSlot(), 2, settings=_settings())
    data = bytearray(_stage_file(root, 2).read_bytes())
    data[len(data) // 2] ^= 0x01
    _stage_file(root, 2).write_bytes(bytes(data))
    fresh = _chunks()
    assert resume_chunks(str(root), fresh, CheckpointSlot(), settings=_settings(), num_steps=5) == 1
    got = fresh[0].module.state_dict()
    assert all(torch.equal(got[k], v) for k, v in saved.items())


def test_no_intact_step_is_refused_naming_the_file(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1])
    _stage_file(root, 1).write_bytes(b"")
    with pytest.raises(files.CheckpointError, match=r"no intact checkpoint .*stage_0.pt: truncated or overwritten: empty"):
        choose_step(root, lambda k: [_stage_file(root, k)], torch.device("cpu"))


def test_torch_load_errors_name_the_file(tmp_path: Path) -> None:
    empty = tmp_path / "empty.pt"
    empty.write_bytes(b"")
    with pytest.raises(files.CheckpointError, match=rf"{empty}: truncated"):
        files.load_verified(empty)
    half = tmp_path / "half.pt"
    torch.save({"w": torch.zeros(1000)}, half)
    half.write_bytes(half.read_bytes()[:3000])
    with pytest.raises(files.CheckpointError, match=rf"{half}: truncated or not a torch checkpoint"):
        files.load_verified(half)


class _Payload:
    def __reduce__(self) -> tuple[object, tuple[str]]:
        return (os.system, ("touch pwned",))


def test_weights_only_refuses_a_malicious_pickle_even_with_a_matching_manifest(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1])
    path = _stage_file(root, 1)
    record = files.write_hashed(path, lambda f: pickle.dump({"model": _Payload()}, f))
    manifest = files.read_manifest(root, 1)
    manifest["files"]["stage_0.pt"] = record  # the attacker rewrote the manifest too
    files.write_manifest(root, 1, manifest["files"], manifest["settings"])
    with pytest.raises(files.CheckpointError, match=rf"{path}: refused \(weights_only=True"):
        resume_chunks(str(root), _chunks(), CheckpointSlot(), settings=_settings(), num_steps=5)
    assert not (Path.cwd() / "pwned").exists() and not (root / "pwned").exists()


def test_keep_last_keeps_the_newest_complete_steps_and_removes_partial_ones(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    (root / "step_0").mkdir(parents=True)  # a partial step (no manifest) a killed run left
    _save(root, [1, 2, 3, 4, 5], keep_last=2)
    assert sorted(p.name for p in root.glob("step_*")) == ["step_4", "step_5"]


def _write_under_limit(tmp_path: Path, limit: int) -> subprocess.CompletedProcess[str]:
    script = textwrap.dedent(f"""
        import resource, signal, torch
        from pathlib import Path
        from planner.runtime.checkpoint_files import write_hashed
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
        write_hashed(Path({str(tmp_path / "step_1" / "stage_0.pt")!r}), lambda f: torch.save({{"w": torch.zeros(10000)}}, f))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120, check=False)


def test_a_failing_write_names_the_file_and_the_cause_and_leaves_no_tmp(tmp_path: Path) -> None:
    """A file-size limit (EFBIG) stands for a full disk: the write fails in ``write(2)`` the
    same way; torch alone reported ``enforce fail at inline_container.cc:672``."""
    proc = _write_under_limit(tmp_path, 4096)
    assert proc.returncode != 0
    target = tmp_path / "step_1" / "stage_0.pt"
    assert f"{target}: cannot write the checkpoint: File too large (EFBIG)" in proc.stderr, proc.stderr[-2000:]
    assert "inline_container" not in proc.stderr.splitlines()[-1]
    assert not target.exists() and not list(tmp_path.rglob("*.tmp"))


def test_a_second_run_cannot_take_a_locked_checkpoint_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "ckpt"
    lock = files.DirectoryLock(root).acquire()
    (root / ".stage_0.pt.123.tmp").write_bytes(b"x")
    try:
        with pytest.raises(PlannerInputError, match=rf"--checkpoint-dir {root}: in use by another run \(pid {os.getpid()} on"):
            files.DirectoryLock(root).acquire()
        plan_path = tmp_path / "plan.json"
        save_plan(_plan(), plan_path)
        assert planner_main(["run", str(plan_path), "--model", MLP, "--checkpoint-dir", str(root), "--nproc", "1"]) == 2
        assert "in use by another run" in capsys.readouterr().err
    finally:
        lock.release()
    files.DirectoryLock(root).acquire().release()  # free again once released
    assert not list(root.glob("*.tmp"))  # what a killed run left is removed by the next holder


def test_every_setting_that_differs_on_resume_is_refused_in_one_line() -> None:
    saved = _settings()
    source = "ckpt/step_2/manifest.json"
    cases = {
        "lr": (dict(saved, lr=0.5), "--lr 0.1 but this run has --lr 0.5; pass --lr 0.1, or --allow-resume-change lr"),
        "dtype": (dict(saved, dtype="float32"), "--dtype float64 but this run has --dtype float32"),
        "optimizer": (dict(saved, optimizer="adamw"), "--optimizer sgd but this run has --optimizer adamw"),
        "seed": (dict(saved, seed=3), "--seed 0 but this run has --seed 3"),
        "plan": (dict(saved, global_batch=99), "written under another plan: global_batch 4 there, 99 now"),
    }
    for name, (run, message) in cases.items():
        with pytest.raises(PlannerInputError) as info:
            compare_settings(source, saved, run, (), 2, 5)
        assert message in str(info.value) and "\n" not in str(info.value), name
    with pytest.raises(PlannerInputError, match="has 2 completed steps and --steps is 2: nothing to train"):
        compare_settings(source, saved, saved, (), 2, 2)
    applied = compare_settings(source, saved, dict(saved, lr=0.5), ("lr",), 2, 5)
    assert applied == [f"--resume: lr 0.1 in {source} -> 0.5 (--lr), applied to every optimizer"]


def test_an_allowed_lr_change_is_applied_to_the_optimizer(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1], optimizer=OptimizerFamily.ADAMW)
    fresh = _chunks(OptimizerFamily.ADAMW, lr=0.5)
    settings = dict(_settings(), lr=0.5, optimizer="adamw")
    files_settings = files.read_manifest(root, 1)["settings"]
    files.write_manifest(root, 1, files.read_manifest(root, 1)["files"], dict(files_settings, optimizer="adamw"))
    with pytest.raises(PlannerInputError, match=r"--lr 0\.1 but this run has --lr 0\.5"):
        resume_chunks(str(root), fresh, CheckpointSlot(), settings=settings, num_steps=5, lr=0.5)
    resume_chunks(str(root), fresh, CheckpointSlot(), settings=settings, allowed=("lr",), num_steps=5, lr=0.5)
    assert all(g["lr"] == 0.5 for g in fresh[0].optimizer.param_groups)  # type: ignore[union-attr]


def test_a_checkpoint_without_manifest_is_still_checked_for_dtype_and_optimizer(tmp_path: Path, group: None) -> None:
    """Directories written before manifests load, unverified, when the run says so
    (``--trust-unverified-checkpoint``); a float64 one is not cast into a float32 run, and
    AdamW state does not go into SGD (was ``KeyError``)."""
    root = tmp_path / "ckpt"
    _save(root, [1], optimizer=OptimizerFamily.ADAMW)
    (root / "step_1" / "manifest.json").unlink()
    trusted = {"trust_unverified": True}
    with pytest.raises(PlannerInputError, match=r"stage_0.pt holds float64 tensors but this run trains in float32"):
        resume_chunks(str(root), _chunks(OptimizerFamily.ADAMW, dtype=torch.float32), CheckpointSlot(), num_steps=5, **trusted)
    with pytest.raises(PlannerInputError, match=r"stage_0.pt: its optimizer state does not fit this run's SGD"):
        resume_chunks(str(root), _chunks(OptimizerFamily.SGD), CheckpointSlot(), num_steps=5, **trusted)
    with pytest.raises(PlannerInputError, match="has 1 completed steps and --steps is 1"):
        resume_chunks(str(root), _chunks(OptimizerFamily.ADAMW), CheckpointSlot(), num_steps=1, **trusted)


# ---------------------------------------------------------------- issue 52: nothing unverified, nothing blocking
# On 8607f8e (before issue 52) a bit-flipped stage file in a directory whose manifests were removed
# loaded and trained with only a warning; a FIFO named manifest.json or latest.json blocked the
# resume for ever (json.loads(path.read_text())), and a link to /dev/zero grew without bound.


def test_a_flipped_tensor_without_manifest_is_refused_unless_trusted(
    tmp_path: Path, group: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1, 2])
    for step in (1, 2):
        (root / f"step_{step}" / "manifest.json").unlink()
    data = bytearray(_stage_file(root, 2).read_bytes())
    data[len(data) // 2] ^= 0x01
    _stage_file(root, 2).write_bytes(bytes(data))
    fresh = _chunks()
    before = {k: v.clone() for k, v in fresh[0].module.state_dict().items()}
    with pytest.raises(PlannerInputError) as info:
        resume_chunks(str(root), fresh, CheckpointSlot(), settings=_settings(), num_steps=5)
    message = str(info.value)
    assert "\n" not in message and "no step with a manifest.json" in message and "--trust-unverified-checkpoint" in message
    assert all(torch.equal(fresh[0].module.state_dict()[k], v) for k, v in before.items())  # nothing was loaded
    assert resume_chunks(str(root), fresh, CheckpointSlot(), num_steps=5, trust_unverified=True) == 2
    assert "loading step 2 without verification (--trust-unverified-checkpoint)" in capsys.readouterr().err


def test_the_verified_step_is_taken_over_a_newer_one_without_manifest(tmp_path: Path, group: None) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1, 2])
    (root / "step_2" / "manifest.json").unlink()
    data = bytearray(_stage_file(root, 2).read_bytes())
    data[len(data) // 2] ^= 0x01
    _stage_file(root, 2).write_bytes(bytes(data))
    assert resume_chunks(str(root), _chunks(), CheckpointSlot(), settings=_settings(), num_steps=5) == 1


def _special(path: Path, kind: str) -> None:
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to("/dev/zero")


def _cpu_bounded(fn: object) -> tuple[BaseException | None, float]:
    """Run ``fn`` under a 10 s alarm; (its exception, CPU seconds). A blocked read fails here."""
    import signal
    import time

    def fire(signum: int, frame: object) -> None:
        raise TimeoutError("blocked for 10 s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, 10.0)
    cpu = time.process_time()
    try:
        fn()  # type: ignore[operator]
        error: BaseException | None = None
    except Exception as exc:
        error = exc
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return error, time.process_time() - cpu


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
@pytest.mark.parametrize("target", ["manifest", "latest", "stage"])
def test_a_special_file_in_a_checkpoint_directory_is_refused_in_one_line(
    tmp_path: Path, group: None, kind: str, target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    _save(root, [1])
    if target == "latest":  # only latest.json names a step: read when no step has a manifest
        (root / "step_1" / "manifest.json").unlink()
        bad = root / "latest.json"
    else:
        bad = root / "step_1" / ("manifest.json" if target == "manifest" else "stage_0.pt")
    _special(bad, kind)
    error, cpu = _cpu_bounded(lambda: resume_chunks(str(root), _chunks(), CheckpointSlot(), settings=_settings(),
                                                    num_steps=5, trust_unverified=True))
    assert isinstance(error, (PlannerInputError, files.CheckpointError)), repr(error)
    assert str(bad) in str(error) and "\n" not in str(error) and cpu < 1.0, (str(error), cpu)
    what = "a FIFO (named pipe)" if kind == "fifo" else "a character device"
    assert what in str(error), str(error)


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_planner_run_refuses_a_special_manifest_before_torchrun(tmp_path: Path, group: None, kind: str) -> None:
    """The launcher's own reading of the directory (``--resume`` checked before torchrun)."""
    root = tmp_path / "ckpt"
    _save(root, [1])
    _special(root / "step_1" / "manifest.json", kind)
    plan_path = tmp_path / "plan.json"
    save_plan(_plan(), plan_path)
    argv = [sys.executable, "-m", "planner", "run", str(plan_path), "--model", MLP, "--checkpoint-dir", str(root),
            "--resume", "--dtype", "float64", "--lr", "0.1", "--steps", "5"]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert str(root / "step_1" / "manifest.json") in lines[0] and "no readable checkpoint manifest" in lines[0]


def test_settings_record_names_the_plans_layout() -> None:
    plan = dataclasses.replace(_plan(), global_batch=_plan().global_batch)
    record = run_settings_record(RuntimeOptions(plan_path="p", model_spec=MLP), plan)
    assert record["stages"] == [[0, 5]] and record["layout"] == plan.layout.describe()


def test_a_checkpoint_directory_without_room_for_one_checkpoint_is_refused(tmp_path: Path) -> None:
    from planner.runtime.preflight import check_outputs, checkpoint_bytes

    need = checkpoint_bytes(load_workload(MLP, 0), DType.FLOAT64, OptimizerFamily.ADAMW)
    assert need > 3 * 8 * sum(p.numel() for layer in load_workload(MLP, 0).layers for p in layer.parameters())
    with pytest.raises(PlannerInputError, match=r"--checkpoint-dir .*: .* has \d+ bytes free, \d+ needed \(No space left"):
        check_outputs("", str(tmp_path / "ckpt"), 1 << 62)
    files.DirectoryLock(tmp_path / "ckpt").acquire().release()  # the refusal released the lock


def test_planner_run_refuses_a_resume_that_differs_before_torchrun(
    tmp_path: Path, group: None, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "ckpt"
    _save(root, [2])
    plan_path = tmp_path / "plan.json"
    save_plan(_plan(), plan_path)
    base = ["run", str(plan_path), "--model", MLP, "--checkpoint-dir", str(root), "--resume", "--dtype", "float64"]
    assert planner_main([*base, "--lr", "0.5", "--steps", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "was trained with --lr 0.1 but this run has --lr 0.5" in err, err
    assert planner_main([*base, "--lr", "0.1", "--steps", "2"]) == 2
    assert "has 2 completed steps and --steps is 2: nothing to train" in capsys.readouterr().err
