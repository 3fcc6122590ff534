"""Model specs: ``NAME[:key=value,...]`` for the zoo, ``package.module:callable[:key=value,...]``
for a user factory. Every bad spec raises :class:`PlannerInputError` with a one-line message.

A factory is arbitrary code (like any entry point), run in this process: importing its module
and calling it are guarded (:func:`guarded`) so that whatever it does ends in one line and
exit 2 within a bounded time, instead of a traceback, a silent exit or a hang:

- an exception (``RecursionError`` included): "factory raised ...";
- ``sys.exit(n)`` / ``SystemExit``: "factory called sys.exit(n)";
- ``os._exit(n)`` and ``os.abort()``: replaced while the factory runs by functions that raise
  instead, reported as "factory called os._exit(n)" (a process cannot be saved once either
  runs, and a child process per factory would build every model twice);
- ``KeyboardInterrupt`` raised by the factory itself: reported; a real Ctrl-C (SIGINT) during
  the factory still interrupts (exit 130);
- blocking or running too long (``signal.pause()``, a deadlock, a loop): interrupted after
  ``PLANNER_FACTORY_TIMEOUT_S`` seconds (default 600; a ``SIGALRM`` timer, so only in the main
  thread, and only code that returns to the interpreter: a C call that never returns is not);
- calling the planner again (``--model planner.commands.cli:main``): the inner call is refused
  at once, and the outer reports "factory calls the planner's model loading again".

Decisions: a factory that kills its own process by a signal (``os.kill(os.getpid(), 9)``) or
crashes the interpreter is not caught -- nothing in-process can. :func:`check_spec` refuses
``hf:`` specs (an unsupported architecture, a bad config) before torch or transformers is
imported.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from planner.artifacts.errors import PlannerInputError
from planner.models.workload import Workload

#: seconds a factory (its import, then its call) may take unless PLANNER_FACTORY_TIMEOUT_S says otherwise
DEFAULT_FACTORY_TIMEOUT_S = 600.0


def check_spec(spec: str, *, dtype: str | None = None) -> None:
    """Refuse what can be refused about ``spec`` without torch: an ``hf:`` spec's config, model
    type and options (:func:`planner.models.hf_spec.parse_spec`, no transformers), and an empty spec."""
    from planner.models.hf_spec import parse_spec

    spec = spec.strip()
    head, _, rest = spec.partition(":")
    if head == "hf":
        parse_spec(rest, spec, dtype)
    elif not head:
        raise PlannerInputError(f"model spec {spec!r}: empty (give a zoo name, hf:CONFIG or package.module:callable)")


class _FactoryEnded(BaseException):
    """Raised in place of ``os._exit`` / ``os.abort`` / by the timer while a factory runs."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what


class _Reentered(BaseException):
    """A factory called the planner's model loading again (a BaseException, so that an inner
    ``planner`` command does not report it as its own error and return)."""


_STATE = threading.local()


def _timeout_s() -> float:
    text = os.environ.get("PLANNER_FACTORY_TIMEOUT_S", "")
    try:
        value = float(text) if text else DEFAULT_FACTORY_TIMEOUT_S
    except ValueError:
        raise PlannerInputError(f"PLANNER_FACTORY_TIMEOUT_S={text[:40]!r}: expected a number of seconds") from None
    if not 0 < value <= 10**6:
        raise PlannerInputError(f"PLANNER_FACTORY_TIMEOUT_S={text[:40]!r}: expected a number of seconds in (0, 1e6]")
    return value


@contextmanager
def _exits_raise() -> Iterator[None]:
    """``os._exit`` and ``os.abort`` raise :class:`_FactoryEnded` for the duration."""

    def _exit(status: Any = 0, *args: Any, **kwargs: Any) -> NoReturn:
        raise _FactoryEnded(f"called os._exit({status!r})")

    def _abort(*args: Any, **kwargs: Any) -> NoReturn:
        raise _FactoryEnded("called os.abort()")

    saved = os._exit, os.abort
    os._exit, os.abort = _exit, _abort
    try:
        yield
    finally:
        os._exit, os.abort = saved


@contextmanager
def _deadline(seconds: float, user_interrupt: list[bool]) -> Iterator[None]:
    """SIGALRM after ``seconds`` raises :class:`_FactoryEnded`; a SIGINT is marked as the user's.
    Only in the main thread (signals are delivered there); a timer already set is restored."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "setitimer"):
        yield
        return

    def _alarm(signum: int, frame: Any) -> None:
        raise _FactoryEnded(f"did not return within {seconds:g} s (PLANNER_FACTORY_TIMEOUT_S)")

    def _interrupt(signum: int, frame: Any) -> None:
        user_interrupt.append(True)
        raise KeyboardInterrupt

    start = time.monotonic()
    old_alarm = signal.signal(signal.SIGALRM, _alarm)
    own_int = signal.getsignal(signal.SIGINT) is signal.default_int_handler
    old_int = signal.signal(signal.SIGINT, _interrupt) if own_int else None
    old_timer, _ = signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old_alarm)
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)
        if old_timer:
            signal.setitimer(signal.ITIMER_REAL, max(old_timer - (time.monotonic() - start), 1e-3))


def guarded(call: Callable[[], Any], what: str) -> Any:
    """``call()`` (a factory's import or call) with every way it can end reported as one
    :class:`PlannerInputError` naming ``what`` (see the module docstring)."""
    if getattr(_STATE, "active", False):
        raise _Reentered
    user_interrupt: list[bool] = []
    _STATE.active = True
    try:
        with _exits_raise(), _deadline(_timeout_s(), user_interrupt):
            return call()
    except _Reentered:
        raise PlannerInputError(f"{what} calls the planner's model loading again (a factory must build a model, "
                                "not run the planner)") from None
    except _FactoryEnded as exc:
        raise PlannerInputError(f"{what} {exc.what}") from None
    except SystemExit as exc:
        raise PlannerInputError(f"{what} called sys.exit({exc.code!r})") from None
    except KeyboardInterrupt:
        if user_interrupt:
            raise
        raise PlannerInputError(f"{what} raised KeyboardInterrupt") from None
    except RecursionError:
        raise PlannerInputError(f"{what} raised RecursionError (maximum recursion depth exceeded)") from None
    except BaseException as exc:  # every other way out of arbitrary code: one line
        raise PlannerInputError(f"{what} raised {type(exc).__name__}: {_one_line(str(exc))[:300]}") from None
    finally:
        _STATE.active = False


def _one_line(text: str) -> str:
    return " ".join(str(text).split())


def split_options(text: str, spec: str) -> dict[str, str]:
    """``"a=1,b=x"`` -> ``{"a": "1", "b": "x"}`` (empty text -> no options)."""
    options: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise PlannerInputError(f"model spec {spec!r}: option {item!r} is not key=value")
        options[key.strip()] = value.strip()
    return options


def _convert(value: str, tp: Any, where: str) -> Any:
    if tp in (int, "int"):
        try:
            return int(value)
        except ValueError:
            raise PlannerInputError(f"{where} must be an integer (got {value!r})") from None
    if tp in (float, "float"):
        try:
            return float(value)
        except ValueError:
            raise PlannerInputError(f"{where} must be a number (got {value!r})") from None
    return value


def build_config(cls: type, options: dict[str, str], spec: str) -> Any:
    """Instantiate the zoo config dataclass ``cls`` from string options, typed by its fields;
    integers must be >= 1, but ``seed`` and the fields the class lists in ``ZERO_ALLOWED`` (>= 0)."""
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise PlannerInputError(
            f"model spec {spec!r}: unknown option {unknown[0]!r} (allowed: {', '.join(fields)})"
        )
    values = {k: _convert(v, fields[k].type, f"model spec {spec!r}: option {k!r}") for k, v in options.items()}
    for key, value in values.items():
        least = 0 if key in getattr(cls, "ZERO_ALLOWED", ()) else 1  # counts the config says may be 0
        if isinstance(value, int) and value < least and key != "seed":
            raise PlannerInputError(f"model spec {spec!r}: option {key!r} must be >= {least} (got {value})")
    return cls(**values)


def _auto(value: str) -> Any:
    for tp in (int, float):
        try:
            return tp(value)
        except ValueError:
            pass
    return value


def load_factory(target: str, options: dict[str, str], spec: str) -> Workload:
    """Import ``package.module:callable``, call it with the options as keyword arguments, both
    :func:`guarded`.

    Option values are passed as ``int`` when they parse as one, else ``float``, else ``str``.
    """
    module_name, _, attr = target.partition(":")
    try:
        module = guarded(lambda: importlib.import_module(module_name), f"model spec {spec!r}: importing {module_name!r}")
    except PlannerInputError as exc:
        text = str(exc)
        if " raised ModuleNotFoundError: " not in text and " raised ImportError: " not in text:
            raise
        raise PlannerInputError(f"model spec {spec!r}: cannot import {module_name!r} ({text.split(' raised ', 1)[1]})") from None
    factory: Callable[..., Any] | None = getattr(module, attr, None)
    if not callable(factory):
        raise PlannerInputError(f"model spec {spec!r}: {module_name!r} has no callable {attr!r}")
    kwargs = {k: _auto(v) for k, v in options.items()}
    # looked up again inside the guard: ``os:_exit`` then names the guard's stand-in
    workload = guarded(lambda: getattr(module, attr)(**kwargs), f"model spec {spec!r}: factory")
    if not isinstance(workload, Workload):
        raise PlannerInputError(
            f"model spec {spec!r}: factory returned {type(workload).__name__}, expected planner.Workload"
        )
    return workload
