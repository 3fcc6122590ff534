"""Faults a cluster inflicts on a run, injected from the outside, many trials each (issue 22).

    python benchmarks/faults.py [--trials 20] [--timeout-s 5] [--classes kill,stop,...] [--seed 0]

The run: the toy zoo GPT (``emulated_setup.MODEL_SPEC``) on a 2-stage plan (2 processes; every
fourth kill / stop trial a 4-stage plan on 4 processes), emulated compute (each step ~0.3 s,
so a fault lands mid-training), float32, AdamW (so optimizer state matters on resume),
``--steps 12 --checkpoint-every 1 --keep-last 3 --timeout-s T``. A reference run without
faults gives every step's loss. Classes, each trial drawn from ``random.Random(seed, trial)``:

- **kill**: SIGKILL to a random rank once step j (random) is committed, after a random delay
  of up to one step (so some land inside a checkpoint write); torchrun started as ``planner
  run`` starts it (``python -m planner.runtime.launch``: torchrun, leaving through ``os._exit``).
- **stop**: SIGSTOP to a random rank, the same way.
- **signal**: to the launcher, cycling SIGTERM and SIGINT to ``planner run``, SIGKILL to
  torchrun, SIGKILL to ``planner run`` (whose torchrun then gets its parent-death SIGTERM).
- **sigkill-run** (issue 52): SIGKILL to ``planner run`` once step j is committed; every other
  trial the stop then reaches each worker a second time 30 ms later (a SIGTERM straight to it,
  as the issue measured the parent-death SIGTERM arriving twice). The workers must stop once,
  after a final checkpoint at the step their line names.
- **corrupt**: 1-8 bits flipped at random in a random file of the newest step of a finished
  6-step run, then ``--resume`` to 12 steps.
- **nomanifest** (issue 52): the same flip with every manifest removed, then ``planner run
  --resume``: refused in one line before torchrun (a directory without manifests cannot be
  verified; ``--trust-unverified-checkpoint`` would load it), never trained on.
- **truncated**: a random file of the newest step cut to a random length (every fourth: 0 bytes).
- **fulldisk**: a full filesystem. ``unshare --user --map-root-user --mount`` gives a private
  tmpfs without privileges (it works here); the checkpoint directory on a tmpfs holding 1.3-3.5
  checkpoints (ENOSPC during a checkpoint: the run must fail naming the file and ENOSPC, keep
  the last committed step intact, leave no ``.tmp``), or, every other trial, the report on a
  tmpfs that a writer fills during training (ENOSPC when the report is written: the results
  must be saved beside the checkpoints). Where user namespaces are refused, a file-size limit
  (``RLIMIT_FSIZE`` below one checkpoint file, with SIGXFSZ ignored) stands in: ``write(2)``
  then fails with EFBIG exactly where a full disk fails with ENOSPC, through the same path.
- **report**: an unwritable ``--report`` (``/dev/full``, under ``/proc``, a directory, under
  a regular file: refused before torchrun), or, every fifth trial, the report's directory
  removed during training (the results saved beside the checkpoints).

Per trial: **culprit named** -- the runtime's lines name the faulty rank and no other
(``rank R failed ...`` / ``rank Q stopped: rank R ...``), or, for the other classes, a line
names the signal, the damaged file, or the unwritable path with its cause; **exit within
timeout+5s** -- from the fault (the signal sent; for file faults the line that met it; a
refused report: the launch) to the end of every process; **orphans** -- processes of the
trial alive after it ended; **silent corruption** -- a run that exits 0 with losses that differ
from the reference (the resume after kill / stop / signal / full disk, and the resume past a
corrupt or truncated checkpoint), or a damaged file loaded without a warning; **results
lost** -- the last committed checkpoint not resumable, a stop signal without its final
checkpoint, or a report neither written nor saved elsewhere; **tracebacks** -- a Python
traceback in the run's output (torchrun's ``SignalException`` or ``ChildFailedError`` among them:
every fault here has its cause named in one line, so none should show).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from emulated_setup import MODEL_SPEC, emulated_plan, emulated_profile

from planner.artifacts.kinds import DType, OptimizerFamily, ScheduleKind
from planner.artifacts.plan import save_plan
from planner.artifacts.profile import save_profile
from planner.artifacts.report import load_report
from planner.runtime import checkpoint_files as ckpt
from planner.runtime.lifecycle import named_at_fault
from planner.runtime.model import load_workload
from planner.runtime.preflight import checkpoint_bytes
from tests.runtime_launch import Launched, alive, descendants

CLASSES = ("kill", "stop", "signal", "sigkill-run", "corrupt", "nomanifest", "truncated", "fulldisk", "report")
STEPS = 12
TORCHRUN = [sys.executable, "-m", "planner.runtime.launch", "--standalone"]  # torchrun, as `planner run` starts it


@dataclass
class Trial:
    cls: str
    variant: str
    named: bool = False
    within: bool = False
    elapsed_s: float = 0.0
    orphans: int = 0
    corrupt: bool = False
    lost: bool = False
    traceback: bool = False
    note: str = ""


class Setup:
    """Plans, profile, reference losses and the base checkpoint of the damage classes."""

    def __init__(self, work: Path, timeout_s: float) -> None:
        self.work, self.timeout_s = work, timeout_s
        profile = emulated_profile()
        self.profile = str(work / "profile.json")
        save_profile(profile, self.profile)
        self.plans = {}
        for stages in (2, 4):
            plan = emulated_plan(profile, num_stages=stages, dp_degree=1, num_microbatches=4,
                                 schedule=ScheduleKind.GPIPE, recompute=False)
            self.plans[stages] = str(work / f"plan{stages}.json")
            save_plan(plan, self.plans[stages])
        self.reference = {s: self._reference(s) for s in (2, 4)}
        self.base = work / "base"  # 6 steps of the 2-stage plan, checkpoints 4..6
        self.run_args(2, self.base, steps=6).check()
        workload = load_workload(MODEL_SPEC, 0)
        self.checkpoint_need = checkpoint_bytes(workload, DType.FLOAT32, OptimizerFamily.ADAMW)

    def flags(self, stages: int, ckpt_dir: Path | None, steps: int = STEPS) -> list[str]:
        out = ["--model", MODEL_SPEC, "--emulate", "--profile", self.profile, "--dtype", "float32", "--optimizer", "adamw",
               "--timeout-s", str(self.timeout_s), "--steps", str(steps), "--warmup-steps", "0"]
        if ckpt_dir is not None:
            out += ["--checkpoint-dir", str(ckpt_dir), "--checkpoint-every", "1", "--keep-last", "3"]
        return out

    def runtime_cmd(self, stages: int, ckpt_dir: Path | None, steps: int = STEPS, extra: tuple[str, ...] = ()) -> list[str]:
        return [*TORCHRUN, "--nproc-per-node", str(stages), "-m", "planner.runtime", "--plan", self.plans[stages],
                *self.flags(stages, ckpt_dir, steps), *extra]

    def run_args(self, stages: int, ckpt_dir: Path | None, steps: int = STEPS, extra: tuple[str, ...] = ()) -> Run:
        return Run(self.runtime_cmd(stages, ckpt_dir, steps, extra))

    def _reference(self, stages: int) -> list[float]:
        report = self.work / f"reference{stages}.json"
        self.run_args(stages, None, extra=("--report", str(report))).check()
        return [s.loss for s in load_report(report).steps]

    def resume_matches(self, stages: int, ckpt_dir: Path, trial: Trial) -> None:
        """Resume to the end; a failure is results lost, a mismatch with exit 0 silent corruption."""
        report = ckpt_dir.parent / "resumed.json"
        run = self.run_args(stages, ckpt_dir, extra=("--resume", "--report", str(report)))
        run.finish(120)
        if run.code != 0:
            trial.lost = True
            trial.note += f" resume exit {run.code}: {run.tail(1)}"
            return
        steps = load_report(report).steps
        reference = self.reference[stages]
        if [s.loss for s in steps] != reference[steps[0].step_idx :] or steps[-1].step_idx != STEPS - 1:
            trial.corrupt = True
            trial.note += f" resumed losses differ from step {steps[0].step_idx}"


class Run:
    """A launch (:class:`tests.runtime_launch.Launched`) and its process tree."""

    #: every launch so far, in order (a trial's tracebacks are those of the launches it made)
    made: ClassVar[list[Run]] = []

    def __init__(self, cmd: list[str], env: dict[str, str] | None = None) -> None:
        self.launched = Launched(cmd, env=env)
        self.code: int | None = None
        self.tree: set[int] = set()
        Run.made.append(self)

    def watch(self) -> None:
        self.tree |= set(descendants(self.launched.proc.pid))

    def finish(self, timeout_s: float) -> int:
        self.watch()
        self.code = self.launched.finish(timeout_s)
        return self.code

    def check(self) -> None:
        if self.finish(300) != 0:
            raise RuntimeError(self.launched.output[-3000:])

    def tail(self, n: int) -> str:
        lines = [line for _, line in self.launched.lines if line.startswith("planner")]
        return " | ".join(lines[-n:])

    def orphans(self) -> int:
        time.sleep(0.3)
        return sum(1 for pid in self.tree if alive(pid))

    def wait_file(self, path: Path, timeout_s: float = 120) -> bool:
        deadline = time.monotonic() + timeout_s
        while not path.exists():
            self.watch()
            if self.launched.proc.poll() is not None or time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        self.watch()
        return True

    def rank_pid(self, rank: int) -> int:
        for pid in sorted(descendants(self.launched.proc.pid)):
            with contextlib.suppress(OSError):
                env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                if f"RANK={rank}".encode() in env and b"-m\0planner.runtime\0" in cmd:
                    return pid
        raise RuntimeError(f"no process of rank {rank}")


def _finish_timed(run: Run, trial: Trial, fault_at: float, setup: Setup, timeout_s: float = 120) -> None:
    run.finish(timeout_s)
    trial.elapsed_s = run.launched.ended - fault_at
    trial.within = trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()


def trial_rank_fault(setup: Setup, rng: random.Random, trial: Trial, sig: signal.Signals, out: Path) -> None:
    stages = 4 if rng.random() < 0.25 else 2
    trial.variant = f"P={stages}"
    run = setup.run_args(stages, out / "ckpt")
    step = rng.randint(1, 8)
    if not run.wait_file(out / "ckpt" / f"step_{step}" / "manifest.json"):
        raise RuntimeError(run.launched.output[-3000:])
    time.sleep(rng.uniform(0, 0.3))
    rank = rng.randrange(stages)
    pid = run.rank_pid(rank)
    fault_at = time.monotonic()
    os.kill(pid, sig)
    _finish_timed(run, trial, fault_at, setup)
    named = named_at_fault(run.launched.output)
    how = "died at step" if sig is signal.SIGKILL else "stopped answering at step"
    trial.named = named == {str(rank)} and f"rank {rank} {how}" in run.launched.output
    if not trial.named:
        trial.note += f" named {sorted(named)} for rank {rank}: {run.tail(2)}"
    if list((out / "ckpt").rglob("*.tmp")):
        trial.note += " .tmp left"
        trial.lost = True
    setup.resume_matches(stages, out / "ckpt", trial)


def trial_signal(setup: Setup, rng: random.Random, trial: Trial, out: Path, index: int) -> None:
    variant = ("SIGTERM", "SIGINT", "SIGKILL-torchrun", "SIGKILL-planner-run")[index % 4]
    trial.variant = variant
    cmd = [sys.executable, "-m", "planner", "run", setup.plans[2], *setup.flags(2, out / "ckpt")]
    run = Run(cmd)
    if not run.wait_file(out / "ckpt" / f"step_{rng.randint(1, 8)}" / "manifest.json"):
        raise RuntimeError(run.launched.output[-3000:])
    time.sleep(rng.uniform(0, 0.3))
    torchrun = next(pid for pid in descendants(run.launched.proc.pid) if b"planner.runtime.launch" in _cmdline(pid))
    fault_at = time.monotonic()
    if variant == "SIGKILL-torchrun":
        os.kill(torchrun, signal.SIGKILL)
    elif variant == "SIGKILL-planner-run":
        run.launched.proc.kill()
    else:
        run.launched.proc.send_signal(getattr(signal, variant))
    run.finish(120)
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in run.tree) and time.monotonic() < deadline:  # a launcher killed: its tree ends on its own
        time.sleep(0.05)
    trial.elapsed_s = max(run.launched.ended, time.monotonic()) - fault_at  # every process ended
    trial.within = trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()
    output = run.launched.output
    if variant in ("SIGTERM", "SIGINT", "SIGKILL-planner-run"):
        sig = "SIGTERM" if variant == "SIGKILL-planner-run" else variant
        line = next((line for line in output.splitlines() if f"stopped by {sig} after" in line), "")
        trial.named = bool(line)
        if line:
            done = int(line.split(" after ")[1].split()[0])
            trial.lost = ckpt.complete_steps(out / "ckpt")[:1] != [done]  # the final checkpoint at the step it names
        else:
            trial.lost = True
    else:
        trial.named = "planner run: torchrun was killed by SIGKILL" in output
    setup.resume_matches(2, out / "ckpt", trial)


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def trial_damage(setup: Setup, rng: random.Random, trial: Trial, out: Path, kind: str, index: int) -> None:
    root = out / "ckpt"
    shutil.copytree(setup.base, root)
    newest = ckpt.complete_steps(root)[0]
    victim = rng.choice(sorted((root / f"step_{newest}").glob("*.pt")))
    data = bytearray(victim.read_bytes())
    if kind == "corrupt":
        bits = rng.randint(1, 8)
        for _ in range(bits):
            pos = rng.randrange(len(data))
            data[pos] ^= 1 << rng.randrange(8)
        trial.variant = f"{bits} bits in {victim.name}"
    else:
        cut = 0 if index % 4 == 0 else rng.randrange(len(data))
        data = data[:cut]
        trial.variant = f"{victim.name} cut to {cut} bytes"
    victim.write_bytes(bytes(data))
    report = out / "resumed.json"
    run = setup.run_args(2, root, extra=("--resume", "--report", str(report)))
    run.finish(120)
    output = run.launched.output
    warning = next((line for _, line in run.launched.lines if "skipping step" in line and str(victim) in line), "")
    met = next((at for at, line in run.launched.lines if line == warning), run.launched.ended)
    trial.named = bool(warning)
    trial.elapsed_s = run.launched.ended - met
    trial.within = trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()
    if run.code != 0:
        trial.lost = True
        trial.note += f" exit {run.code}: {output.splitlines()[-1] if output else ''}"
        return
    steps = load_report(report).steps
    if not warning or [s.loss for s in steps] != setup.reference[2][steps[0].step_idx :]:
        trial.corrupt = True


def _namespaced(script: str) -> list[str]:
    return ["unshare", "--user", "--map-root-user", "--mount", "sh", "-c", script]


def userns_available() -> bool:
    probe = subprocess.run(_namespaced("mount -t tmpfs -o size=64k tmpfs /mnt && true"), capture_output=True, timeout=30,
                           check=False)
    return probe.returncode == 0


def _q(value: str | Path) -> str:
    return "'" + str(value).replace("'", "'\\''") + "'"


def trial_fulldisk(setup: Setup, rng: random.Random, trial: Trial, out: Path, index: int, userns: bool) -> None:
    mount = out / "disk"
    mount.mkdir()
    copy = out / "ckpt"
    report = mount / "report.json"
    on_report = index % 2 == 1 and userns
    if on_report:
        trial.variant = "report on a filling tmpfs (ENOSPC)"
        ckpt_dir = copy
        size_kib = 256
        cmd = setup.runtime_cmd(2, ckpt_dir, extra=("--report", str(report)))
        started = _q(copy / f"step_{rng.randint(1, 6)}" / "manifest.json")
        filler = f"(while [ ! -e {started} ]; do sleep 0.02; done; dd if=/dev/zero of={_q(mount / 'filler')} bs=4k 2>/dev/null) & "
        script = f"mount -t tmpfs -o size={size_kib}k tmpfs {_q(mount)} && {filler}{' '.join(map(_q, cmd))}; echo FAULTS-RUN-ENDED"
    else:
        ckpt_dir = mount / "ckpt"
        cmd = setup.runtime_cmd(2, ckpt_dir)
        if userns:
            room = rng.uniform(1.3, 3.5)
            size_kib = int(room * setup.checkpoint_need / 1024) + 8
            trial.variant = f"checkpoints on a {size_kib} KiB tmpfs (ENOSPC)"
            script = f"mount -t tmpfs -o size={size_kib}k tmpfs {_q(mount)} && {' '.join(map(_q, cmd))}; echo FAULTS-RUN-ENDED; " \
                     f"cp -a {_q(ckpt_dir)} {_q(copy)}"
        else:
            limit = int(rng.uniform(0.2, 0.9) * setup.checkpoint_need)
            trial.variant = f"RLIMIT_FSIZE {limit} B (EFBIG)"
            script = f"ulimit -f {max(1, limit // 512)}; {' '.join(map(_q, cmd))}; echo FAULTS-RUN-ENDED; cp -a {_q(ckpt_dir)} {_q(copy)}"
    run = Run(_namespaced(script) if userns else ["sh", "-c", script])
    run.finish(180)
    lines = run.launched.lines
    cause = "ENOSPC" if userns else "EFBIG"
    line = next((line for _, line in lines if "planner.runtime: rank" in line and cause in line), "")
    met = next((at for at, text in lines if text == line), 0.0)
    ended = next((at for at, text in lines if text == "FAULTS-RUN-ENDED"), run.launched.ended)
    trial.elapsed_s = ended - met if met else 0.0
    trial.within = bool(met) and trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()
    if on_report:
        trial.named = f"cannot write the report {report}" in line and "the results were saved to" in line
        saved = Path(line.split("the results were saved to ")[1]) if trial.named else None
        trial.lost = saved is None or not saved.exists() or len(load_report(saved).steps) != STEPS
        return
    trial.named = bool(line) and (".pt: cannot write" in line or "manifest.json: cannot write" in line)
    if list(copy.rglob("*.tmp")):
        trial.note += " .tmp left"
        trial.lost = True
    if not ckpt.complete_steps(copy):
        trial.note += " no committed step"
        trial.lost = True
        return
    (copy / ckpt.LOCK).unlink(missing_ok=True)
    setup.resume_matches(2, copy, trial)


def trial_report(setup: Setup, rng: random.Random, trial: Trial, out: Path, index: int) -> None:
    regular = out / "regular"
    regular.write_text("x")
    variants = {"/dev/full": "/dev/full", "under /proc": "/proc/planner-faults/report.json", "a directory": str(out),
                "under a regular file": str(regular / "report.json")}
    if index % 5 == 4:
        trial.variant = "directory removed during training"
        directory = out / "reports"
        directory.mkdir()
        report = directory / "report.json"
        run = Run([sys.executable, "-m", "planner", "run", setup.plans[2], *setup.flags(2, out / "ckpt"), "--report", str(report)])
        run.wait_file(out / "ckpt" / f"step_{rng.randint(1, 8)}" / "manifest.json")
        shutil.rmtree(directory)
        run.finish(120)
        line = next((line for _, line in run.launched.lines if "failed after training" in line), "")
        met = next((at for at, text in run.launched.lines if text == line), 0.0)
        trial.named = f"cannot write the report {report}" in line and "ENOENT" in line
        saved = Path(line.split("the results were saved to ")[1]) if "saved to" in line else None
        trial.lost = saved is None or not saved.exists() or len(load_report(saved).steps) != STEPS
        trial.corrupt = "before training" in run.launched.output
    else:
        trial.variant = list(variants)[index % 5 % 4]
        path = variants[trial.variant]
        started = time.monotonic()
        run = Run([sys.executable, "-m", "planner", "run", setup.plans[2], *setup.flags(2, None), "--report", path])
        run.finish(120)
        met = started
        line = next((line for _, line in run.launched.lines if "planner run: error:" in line), "")
        trial.named = run.code == 2 and f"--report {path}" in line
        trial.lost = run.code != 2  # not refused: it trained, and its report could not be written
    trial.elapsed_s = run.launched.ended - met if met else 0.0
    trial.within = bool(met) and trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()


def trial_sigkill_run(setup: Setup, rng: random.Random, trial: Trial, out: Path, index: int) -> None:
    """SIGKILL to ``planner run``; every other trial the stop reaches the workers twice, 30 ms apart."""
    twice = index % 2 == 1
    trial.variant = "SIGKILL, then SIGTERM to each worker 30 ms later" if twice else "SIGKILL"
    run = Run([sys.executable, "-m", "planner", "run", setup.plans[2], *setup.flags(2, out / "ckpt")])
    if not run.wait_file(out / "ckpt" / f"step_{rng.randint(1, 8)}" / "manifest.json"):
        raise RuntimeError(run.launched.output[-3000:])
    time.sleep(rng.uniform(0, 0.3))
    workers = [pid for pid in descendants(run.launched.proc.pid) if b"-m\0planner.runtime\0" in _cmdline(pid)
               and b"planner.runtime.launch" not in _cmdline(pid)]
    fault_at = time.monotonic()
    run.launched.proc.kill()
    if twice:
        time.sleep(0.03)
        for pid in workers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    run.finish(120)
    deadline = time.monotonic() + 60
    while any(alive(pid) for pid in run.tree) and time.monotonic() < deadline:
        time.sleep(0.05)
    trial.elapsed_s = max(run.launched.ended, time.monotonic()) - fault_at
    trial.within = trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()
    line = next((ln for ln in run.launched.output.splitlines() if "stopped by SIGTERM after" in ln), "")
    trial.named = bool(line)
    if not line:
        trial.lost = True
        trial.note += f" no final checkpoint: {run.tail(2)}"
    else:
        done = int(line.split(" after ")[1].split()[0])
        trial.lost = ckpt.complete_steps(out / "ckpt")[:1] != [done]
    setup.resume_matches(2, out / "ckpt", trial)


def trial_no_manifest(setup: Setup, rng: random.Random, trial: Trial, out: Path) -> None:
    """Bits flipped in a directory whose manifests were removed: ``--resume`` refused, not trained on."""
    root = out / "ckpt"
    shutil.copytree(setup.base, root)
    newest = ckpt.complete_steps(root)[0]
    for manifest in root.glob("step_*/manifest.json"):
        manifest.unlink()
    victim = rng.choice(sorted((root / f"step_{newest}").glob("*.pt")))
    data = bytearray(victim.read_bytes())
    bits = rng.randint(1, 8)
    for _ in range(bits):
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
    victim.write_bytes(bytes(data))
    trial.variant = f"{bits} bits in {victim.name}, no manifest"
    started = time.monotonic()
    run = Run([sys.executable, "-m", "planner", "run", setup.plans[2], *setup.flags(2, root), "--resume",
               "--report", str(out / "resumed.json")])
    run.finish(120)
    trial.elapsed_s = run.launched.ended - started
    trial.within = trial.elapsed_s <= setup.timeout_s + 5
    trial.orphans = run.orphans()
    line = next((ln for _, ln in run.launched.lines if "planner run: error:" in ln), "")
    trial.named = run.code == 2 and "--trust-unverified-checkpoint" in line and str(root) in line
    trial.corrupt = run.code == 0 or (out / "resumed.json").exists()  # trained on unverified tensors
    if not trial.named:
        trial.note += f" exit {run.code}: {run.tail(1)}"


def run_trial(setup: Setup, cls: str, index: int, seed: int, userns: bool) -> Trial:
    rng = random.Random(f"{seed}-{cls}-{index}")
    trial = Trial(cls=cls, variant="")
    out = Path(tempfile.mkdtemp(prefix=f"faults-{cls}-{index}-", dir=setup.work))
    first_run = len(Run.made)
    try:
        if cls in ("kill", "stop"):
            trial_rank_fault(setup, rng, trial, signal.SIGKILL if cls == "kill" else signal.SIGSTOP, out)
        elif cls == "signal":
            trial_signal(setup, rng, trial, out, index)
        elif cls == "sigkill-run":
            trial_sigkill_run(setup, rng, trial, out, index)
        elif cls in ("corrupt", "truncated"):
            trial_damage(setup, rng, trial, out, cls, index)
        elif cls == "nomanifest":
            trial_no_manifest(setup, rng, trial, out)
        elif cls == "fulldisk":
            trial_fulldisk(setup, rng, trial, out, index, userns)
        else:
            trial_report(setup, rng, trial, out, index)
    finally:
        shutil.rmtree(out, ignore_errors=True)
    trial.traceback = any("Traceback (most recent call last)" in r.launched.output for r in Run.made[first_run:])
    return trial


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=20, help="trials per fault class (default: %(default)s)")
    parser.add_argument("--timeout-s", type=float, default=5.0, help="the runs' --timeout-s (default: %(default)s)")
    parser.add_argument("--classes", default=",".join(CLASSES), help="comma-separated subset of " + ",".join(CLASSES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    classes = [c for c in args.classes.split(",") if c]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="planner-faults-") as tmp:
        setup = Setup(Path(tmp), args.timeout_s)
        userns = userns_available()
        print(f"full disk: {'a private tmpfs (unshare --user --mount): ENOSPC' if userns else 'RLIMIT_FSIZE: EFBIG'}")
        print(f"{'class':<11} {'trial':>5}  {'named':>5} {'exit s':>7} {'orph':>4} {'corr':>4} {'lost':>4} {'tb':>3}  variant / note")
        trials: list[Trial] = []
        for cls in classes:
            for i in range(args.trials):
                t = run_trial(setup, cls, i, args.seed, userns)
                trials.append(t)
                print(f"{cls:<11} {i:>5}  {'yes' if t.named else 'NO':>5} {t.elapsed_s:>7.2f} {t.orphans:>4} "
                      f"{int(t.corrupt):>4} {int(t.lost):>4} {int(t.traceback):>3}  {t.variant}{t.note}", flush=True)
    print()
    print(f"{'class':<11} {'trials':>6} {'named':>6} {'in time':>7} {'max exit s':>10} {'orphans':>7} {'corrupt':>7} "
          f"{'lost':>5} {'tracebacks':>10}")
    for cls in classes:
        own = [t for t in trials if t.cls == cls]
        print(f"{cls:<11} {len(own):>6} {sum(t.named for t in own):>6} {sum(t.within for t in own):>7} "
              f"{max(t.elapsed_s for t in own):>10.2f} {sum(t.orphans for t in own):>7} {sum(t.corrupt for t in own):>7} "
              f"{sum(t.lost for t in own):>5} {sum(t.traceback for t in own):>10}")
    total = len(trials)
    print(f"(wall time {time.monotonic() - started:.0f} s, --timeout-s {args.timeout_s:g})")
    print(f"faults: {total} trials, culprit named {sum(t.named for t in trials)}/{total}, "
          f"exit within timeout+5s {sum(t.within for t in trials)}/{total}, orphans {sum(t.orphans for t in trials)}, "
          f"silent corruption {sum(t.corrupt for t in trials)}, results lost {sum(t.lost for t in trials)}, "
          f"tracebacks {sum(t.traceback for t in trials)}")


if __name__ == "__main__":
    main()
