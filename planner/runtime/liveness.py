"""Liveness: every rank's progress visible to the others, and the rank at fault named.

Each rank opens its own client of torchrun's agent store (the ``TCPStore`` at
``MASTER_ADDR:MASTER_PORT`` that the agent hosts and that outlives the ranks; keys under
``planner/liveness/<run id>/<restart>/``) and runs one daemon thread that, every
``period`` = clamp(``timeout_s`` / 10, 0.1, 1) seconds:

- beats: ``beat/<r>`` += 1, and publishes ``step/<r>`` (the step it is in, and how many it
  completed) when it changed;
- follows a **verdict**: the one line naming the rank at fault, first writer wins
  (``compare_set``), so every rank prints the same culprit. Seeing one, the rank prints
  ``planner.runtime: rank R stopped: <verdict>`` and leaves, even while its main thread waits
  in a collective;
- watches its peers' beats (all of them up to :data:`WATCH_ALL` ranks, else the next
  :data:`WATCH_RING` ranks round the ring, so every rank is watched and the store serves
  O(N) reads per period): a peer whose beat has not moved for ``timeout_s`` and that has not
  left (``exit/<r>``) has **stopped answering** (SIGSTOP, a frozen host);
- leaves when its launcher is gone: the parent process changed, or the store stopped
  answering (its agent ended).

A rank that fails (:meth:`Liveness.fail`) with its own error (an exception in its code, a
full disk) publishes ``rank R failed <where>: <error>`` as the verdict. A rank whose error
came from a peer (a collective timed out, a connection closed: :func:`is_peer_error`) looks for
the culprit instead, for up to ``max(3 period, 1 s)``: a verdict already published; a peer
on this host whose process is gone or stopped (``/proc/<pid>/stat``, checked against the
process start time the peer published, so a reused pid is never taken for it); a peer whose
beat stalled for 3 periods. Failing that, by elimination: the peers still alive that neither
failed nor left for two periods (at most :data:`ELIMINATION_S`) have **stopped making progress** (a rank
stuck in its own code while its peers time out waiting on it). Only if nothing points
elsewhere does the rank name itself.

The rank that declares a culprit on its own host publishes its verdict, then kills it (SIGKILL:
a stopped process cannot act on torchrun's SIGTERM; no peer finds it gone, calls it dead first),
and removes the temporary files it was writing (``on_peer_gone``: a process killed in a checkpoint
write cannot remove its own). A rank on another host kills it when it reads the verdict. So a
run ends within ``timeout_s`` + a few periods of a rank stopping, and at once when one dies.

Without torchrun's store (``MASTER_ADDR`` unset: one process), liveness is off and a failing
rank names itself.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, NoReturn

from planner.runtime import lifecycle

__all__ = ["Liveness", "ProcessInfo", "StepControl", "is_peer_error", "open_liveness"]

WATCH_ALL = 64
WATCH_RING = 4
ELIMINATION_S = 2.0
#: what a collective or the store says when the failure is elsewhere (gloo, NCCL, c10d)
_PEER_ERROR = re.compile(
    r"connection (closed|reset) by peer|broken pipe|timed out waiting|gloo/transport|\bgloo\b|\bnccl\b|"
    r"watchdog caught collective|processgroup|dist(backend|network|store)error",
    re.IGNORECASE,
)


def is_peer_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or an exception it was raised from) is a failure seen through torch's
    communication (a peer gone, a collective timed out) rather than in this rank's own work:
    a ``torch.distributed.DistError``, or gloo's and NCCL's own messages. Narrow on purpose:
    an own error taken for a peer's would make this rank look for a culprit among peers that
    are only waiting for it."""
    import torch.distributed as dist

    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, dist.DistError):
            return True
        if _PEER_ERROR.search(f"{type(cur).__name__}: {cur}"):
            return True
        cur = cur.__cause__ or cur.__context__
    return False


@dataclass(frozen=True, slots=True)
class ProcessInfo:
    """Where a rank runs: host name, boot id, pid and the process's start time (clock ticks)."""

    host: str
    boot: str
    pid: int
    start: str

    @classmethod
    def current(cls) -> ProcessInfo:
        boot = ""
        with contextlib.suppress(OSError):
            boot = open("/proc/sys/kernel/random/boot_id").read().strip()
        return cls(socket.gethostname(), boot, os.getpid(), _stat(os.getpid())[1])

    def encode(self) -> str:
        return f"{self.host} {self.boot or '-'} {self.pid} {self.start or '-'}"

    @classmethod
    def decode(cls, text: str) -> ProcessInfo:
        host, boot, pid, start = text.split(" ")
        return cls(host, "" if boot == "-" else boot, int(pid), "" if start == "-" else start)

    def same_host(self, other: ProcessInfo) -> bool:
        return self.host == other.host and self.boot == other.boot and bool(self.boot)

    def state(self) -> str:
        """On this host: "gone", "stopped" or "running" ("" when it cannot be told)."""
        state, start = _stat(self.pid)
        if state == "":
            return "gone"
        if self.start and start != self.start:
            return "gone"  # the pid now belongs to another process
        if state in "ZXx":
            return "gone"
        return "stopped" if state in "Tt" else "running"


def _stat(pid: int) -> tuple[str, str]:
    """(state letter, start time) of ``pid`` from ``/proc`` (("", "") when it does not exist)."""
    try:
        text = open(f"/proc/{pid}/stat").read()
    except OSError:
        return "", ""
    rest = text[text.rfind(")") + 2 :].split()
    return rest[0], rest[19]


def open_liveness(rank: int, world_size: int, timeout_s: float) -> Liveness:
    """A :class:`Liveness` on torchrun's agent store (off without one); not started."""
    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    store = None
    if host and port and world_size > 1:
        import torch.distributed as dist

        run = os.environ.get("TORCHELASTIC_RUN_ID", "run")
        restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
        try:
            client = dist.TCPStore(
                host, int(port), is_master=False, timeout=timedelta(seconds=max(timeout_s, 5.0)), wait_for_workers=False
            )
            store = dist.PrefixStore(f"planner/liveness/{run}/{restart}", client)
        except Exception as exc:  # the run goes on; a failure then names the rank that saw it
            print(f"planner.runtime: rank {rank}: warning: liveness off (store {host}:{port}: {exc})", flush=True)
    return Liveness(rank, world_size, timeout_s, store)


class Liveness:
    """See the module docstring. The main thread reports progress with :meth:`at_step` and
    :meth:`completed`, and leaves through :meth:`fail` or :meth:`finish`."""

    def __init__(self, rank: int, world_size: int, timeout_s: float, store: Any) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        self.period = min(1.0, max(0.1, timeout_s / 10.0))
        self.store = store
        self.me = ProcessInfo.current()
        self.step, self.done = -1, 0
        self._lock = threading.Lock()  # one store client, used by the main and the liveness thread
        self._published: tuple[int, int] | None = None
        self._seen: dict[int, tuple[int, float]] = {}  # peer -> (beat, when it last moved)
        self._procs: dict[int, ProcessInfo] = {}
        self._failing = threading.Event()
        self._halt = threading.Event()
        self._parent = os.getppid()
        self._store_errors = 0
        #: called with the pid of a peer on this host found dead or killed (its half-written files)
        self.on_peer_gone: Callable[[int], None] | None = None
        n = world_size
        ring = {(rank + k) % n for k in range(1, min(WATCH_RING, n - 1) + 1)}
        self._watched = sorted(set(range(n)) - {rank}) if n <= WATCH_ALL else sorted(ring)

    # ------------------------------------------------------------------ main thread
    def start(self) -> None:
        lifecycle.at_exit(self._record_exit)
        if self.store is None:
            return
        with self._lock:
            self.store.set(f"proc/{self.rank}", self.me.encode())
            self.store.add(f"beat/{self.rank}", 1)
        threading.Thread(target=self._loop, name="planner-liveness", daemon=True).start()

    def at_step(self, step: int) -> None:
        self.step = step
        self._publish_progress()

    def completed(self, done: int) -> None:
        self.done = done

    def _publish_progress(self) -> None:
        progress = (self.step, self.done)
        if self.store is None or progress == self._published:
            return
        with contextlib.suppress(Exception), self._lock:
            self.store.set(f"step/{self.rank}", f"{progress[0]} {progress[1]}")
            self._published = progress

    def finish(self) -> None:
        """The rank is done: its peers stop watching it."""
        self._halt.set()
        self._record_exit("ok")

    def announce(self, line: str) -> None:
        """Publish ``line`` as the verdict (unless one exists): this rank leaves on its own
        refusal (invalid input), so the peers that then lose it name it."""
        if self.store is not None:
            self._failing.set()
            self._publish(line)

    def fail(self, message: str, exc: BaseException) -> NoReturn:
        """Leave with one line naming the rank at fault (see the module docstring); exit 1.
        ``message`` is this rank's own account (``at step K: ...``, ``before training: ...``)."""
        self._failing.set()
        own = f"rank {self.rank} failed {message}"
        if self.store is None:
            lifecycle.leave(1, f"planner.runtime: {own}")
        if not is_peer_error(exc):
            winner = self._publish(own)
            lifecycle.leave(1, f"planner.runtime: {own}" if winner == own else self._stopped_line(winner, own))
        verdict = self._find_culprit(time.monotonic() + max(3 * self.period, 1.0), own)
        if verdict is None:
            self._safe(lambda: self.store.set(f"exit/{self.rank}", own))  # a waiter, not a culprit
            verdict = self._eliminate(own)
        winner = self._publish(verdict)
        lifecycle.leave(1, f"planner.runtime: {own}" if winner == own else self._stopped_line(winner))

    # ------------------------------------------------------------------ store helpers
    def _safe(self, op: Any) -> Any:
        with self._lock:
            return op()

    def _publish(self, line: str) -> str:
        """Publish ``line`` as the verdict unless one exists; return the verdict."""
        try:
            return str(self._safe(lambda: self.store.compare_set("verdict", "", line)).decode())
        except Exception:
            return line

    def _verdict(self) -> str | None:
        with self._lock:
            if not self.store.check(["verdict"]):
                return None
            return str(self.store.get("verdict").decode())

    def _record_exit(self, line: str) -> None:
        if self.store is not None:
            with contextlib.suppress(Exception):
                self._safe(lambda: self.store.set(f"exit/{self.rank}", line or "left"))

    def _has_left(self, peer: int) -> bool:
        return bool(self._safe(lambda: self.store.check([f"exit/{peer}"])))

    def _proc(self, peer: int) -> ProcessInfo | None:
        if peer not in self._procs:
            with self._lock:
                if not self.store.check([f"proc/{peer}"]):
                    return None
                self._procs[peer] = ProcessInfo.decode(self.store.get(f"proc/{peer}").decode())
        return self._procs[peer]

    def _where(self, peer: int) -> str:
        """``at step S`` (or ``before training``), as the peer last published it."""
        with self._lock:
            if not self.store.check([f"step/{peer}"]):
                return "before training"
            step, _done = self.store.get(f"step/{peer}").decode().split()
        return "before training" if int(step) < 0 else f"at step {step}"

    def _stopped_line(self, verdict: str, own: str = "") -> str:
        culprit = verdict.split()[1] if verdict.startswith("rank ") else ""
        if culprit == str(self.rank):
            return f"planner.runtime: rank {self.rank} leaves, named at fault: {verdict}"
        tail = f" (then: {own})" if own else ""
        return f"planner.runtime: rank {self.rank} stopped: {verdict}{tail}"

    # ------------------------------------------------------------------ culprits
    def _beat_age(self, peer: int, now: float) -> float | None:
        """Seconds since the peer's beat last moved, as this rank saw it (None: never beat)."""
        beat = int(self._safe(lambda: self.store.add(f"beat/{peer}", 0)))
        if beat == 0:
            return None
        last = self._seen.get(peer)
        if last is None or last[0] != beat:
            self._seen[peer] = (beat, now)
            return 0.0
        return now - last[1]

    def _declare(self, peer: int, how: str, age: float | None) -> str:
        """The verdict naming ``peer``; on this host and not gone: published, then killed."""
        proc = self._proc(peer)
        where = self._where(peer)
        heartbeat = f"no heartbeat for {age:.1f} s" if age is not None else "no heartbeat"
        if proc is not None and proc.same_host(self.me):
            state = proc.state()
            if state == "gone":
                self._gone(proc)
                return f"rank {peer} died {where} (its process {proc.pid} is gone)"
            if state == "stopped":
                line = f"rank {peer} stopped answering {where} (process {proc.pid} was stopped, {heartbeat}; killed it)"
                return self._publish_and_kill(proc, line)
            if how == "stuck":
                return f"rank {peer} stopped making progress {where} (process {proc.pid} alive, its peers timed out waiting)"
            return self._publish_and_kill(proc, f"rank {peer} stopped answering {where} ({heartbeat}; killed process {proc.pid})")
        host = f" on {proc.host}" if proc is not None else ""
        if how == "stuck":
            return f"rank {peer} stopped making progress {where} (alive{host}, its peers timed out waiting)"
        return f"rank {peer} stopped answering {where} ({heartbeat}{host})"

    def _publish_and_kill(self, proc: ProcessInfo, line: str) -> str:
        """Publish ``line``, then kill its culprit (a peer finding it gone finds the verdict first)."""
        winner = self._publish(line)
        self._kill(proc)
        return winner

    def _kill(self, proc: ProcessInfo) -> None:
        if proc.same_host(self.me) and proc.state() in ("stopped", "running") and proc.pid != os.getpid():
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)
            self._gone(proc)

    def _gone(self, proc: ProcessInfo) -> None:
        """A peer on this host died or was killed: remove what it was half-way writing."""
        if self.on_peer_gone is not None and proc.same_host(self.me):
            with contextlib.suppress(Exception):
                self.on_peer_gone(proc.pid)

    def _find_culprit(self, deadline: float, own: str) -> str | None:
        """A verdict, a dead or stopped peer on this host, or a peer whose beat stalled for 3
        periods, by ``deadline``; None when none shows."""
        peers = [p for p in range(self.world_size) if p != self.rank]
        procs = [self._proc(p) for p in peers]
        if all(proc is not None and proc.same_host(self.me) for proc in procs):
            deadline = min(deadline, time.monotonic() + self.period)  # /proc tells dead and stopped at once
        while True:
            verdict = self._verdict()
            if verdict is not None:
                return verdict
            now = time.monotonic()
            for peer in peers:
                proc = self._proc(peer)
                if proc is not None and proc.same_host(self.me) and proc.state() in ("gone", "stopped"):
                    if not self._has_left(peer):
                        return self._declare(peer, "dead", self._beat_age(peer, now))
                age = self._beat_age(peer, now)
                if age is not None and age > 3 * self.period and not self._has_left(peer):
                    return self._declare(peer, "silent", age)
            if time.monotonic() > deadline:
                return None
            time.sleep(self.period / 2)

    def _eliminate(self, own: str) -> str:
        """After a timeout with every peer alive: the peers that neither fail nor leave within
        :data:`ELIMINATION_S` are stuck; the least advanced of them is named (else this rank)."""
        now = time.monotonic()
        deadline, stuck, since = now + ELIMINATION_S, [-1], now
        while time.monotonic() < deadline:
            verdict = self._verdict()
            if verdict is not None:
                return verdict
            now_stuck = [p for p in range(self.world_size) if p != self.rank and not self._has_left(p)]
            if not now_stuck:
                return own
            if now_stuck != stuck:
                stuck, since = now_stuck, time.monotonic()
            elif time.monotonic() - since >= 2 * self.period:
                break  # no peer has left for two periods: the ones left are stuck
            time.sleep(self.period / 2)
        if len(stuck) > 1:  # the least advanced: the lowest (step, completed) it published
            def progress(peer: int) -> tuple[int, int, int]:
                with self._lock:
                    text = self.store.get(f"step/{peer}").decode() if self.store.check([f"step/{peer}"]) else "-1 0"
                step, done = (int(v) for v in text.split())
                return step, done, peer

            stuck.sort(key=progress)
        return self._declare(stuck[0], "stuck", None)

    # ------------------------------------------------------------------ the thread
    def _loop(self) -> None:
        while not self._halt.wait(self.period):
            try:
                self._tick()
                self._store_errors = 0
            except Exception as exc:
                self._store_errors += 1
                if self._store_errors >= 3 and not self._failing.is_set() and not self._halt.is_set():
                    host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
                    lifecycle.leave(
                        1,
                        f"planner.runtime: rank {self.rank}: the launcher's store {host}:{port} stopped answering "
                        f"({type(exc).__name__}); leaving",
                    )

    def _tick(self) -> None:
        if os.getppid() != self._parent and not self._halt.is_set():
            lifecycle.leave(1, f"planner.runtime: rank {self.rank}: its launcher (process {self._parent}) is gone; leaving")
        with self._lock:
            self.store.add(f"beat/{self.rank}", 1)
        self._publish_progress()
        if self._failing.is_set():
            return  # the main thread is naming the culprit and will leave
        verdict = self._verdict()
        if verdict is not None:
            self._follow(verdict)
        now = time.monotonic()
        for peer in self._watched:
            age = self._beat_age(peer, now)
            if age is not None and age > self.timeout_s and not self._has_left(peer):
                self._follow(self._publish(self._declare(peer, "silent", age)))

    def _follow(self, verdict: str) -> NoReturn:
        """Leave on ``verdict``: kill its culprit if it is on this host, print, exit 1."""
        culprit = verdict.split()[1] if verdict.startswith("rank ") else ""
        if culprit.isdigit() and int(culprit) != self.rank:
            proc = self._proc(int(culprit))
            if proc is not None and proc.state() == "stopped":
                self._kill(proc)
            elif proc is not None and proc.state() == "gone":
                self._gone(proc)
        lifecycle.leave(1, self._stopped_line(verdict))


class StepControl:
    """What the step loop (``planner.runtime.runner.run_steps``) tells the rank's lifecycle and
    liveness: the step it enters, the steps it completed, and whether the ranks agreed to stop
    (:func:`planner.runtime.lifecycle.stop_signal_everywhere`, collective)."""

    def __init__(self, liveness: Liveness | None, world_size: int, device: Any) -> None:
        self.liveness, self.world_size, self.device = liveness, world_size, device

    def begin_step(self, step: int) -> None:
        lifecycle.set_phase(lifecycle.Phase.TRAINING, step)
        if self.liveness is not None:
            self.liveness.at_step(step)

    def end_step(self, done: int) -> int:
        """After step ``done - 1``: the stop signal the ranks agreed on (0: go on)."""
        if self.liveness is not None:
            self.liveness.completed(done)
        return lifecycle.stop_signal_everywhere(self.device, self.world_size)
