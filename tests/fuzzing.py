"""Hostile inputs for every loader, shared by tests/test_fuzz.py and benchmarks/fuzz_loaders.py.

Every loader reads a *file* (the whole boundary: special files, size, bytes, UTF-8, JSON, the
document), as the CLI does. Mutation classes, each with its oracle:

- JSON text: ``truncate`` (refused unless the prefix is still JSON), ``non_utf8`` (refused),
  ``bom`` (a UTF-8 byte-order mark before a valid file: accepted, RFC 8259 lets a parser ignore
  it, and loads the same document), ``empty`` (refused), ``duplicate_key`` (refused),
  ``surrogate`` (a lone ``\\ud800`` in a string or a key: refused), ``constant`` (NaN, Infinity,
  -Infinity, 1e400 for a number: refused);
- JSON data (the parsed document mutated, then written): ``type_swap``, ``delete``,
  ``extra_key``, ``deep`` (a value nested 50 to 100,000 deep), ``long_string`` (10^4 to 10^6
  characters): refused when the document then breaks its JSON Schema (``planner/schemas``,
  checked with ``jsonschema``, an independent reading of the format); ``huge`` (1e308, 2^70,
  1.8e308 or -1e9 for a value): refused wherever the document does not hold free-form data
  (``metadata``, ``versions``, ``sources``), -1e9 also where a negative number is meaningful
  (a time fit's intercept; a relative error is bounded at -1 and refused, a loss at 0);
- text (PipeDream ``graph.txt``): ``truncate``, ``drop_line`` (either), ``non_utf8``, ``empty``,
  ``poison_number`` (nan, inf, 1e400, -1, 1e308 for a time or a size: refused), ``duplicate_node``
  (refused), ``bom`` (accepted);
- special files for every loader: a FIFO, ``/dev/zero``, a directory, a socket, an empty file:
  refused without blocking.

"Either" means any outcome but a crash: the mutant may still be a valid document (a number
made 0.5 times smaller is still a time). A result is a *crash* (an exception other than
``PlannerInputError``, or a message that is not one line naming the file), a *hang* (more than
``HANG_S`` seconds of wall time, interrupted by ``SIGALRM``), *slow* (more than ``CPU_LIMIT_S``
seconds of CPU), or a *silent acceptance* (a mutant the oracle says must be refused, loaded).
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import random
import signal
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from planner.artifacts.cluster import PRESETS, cluster_to_json, load_cluster
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import DType, OptimizerFamily
from planner.artifacts.plan import load_plan, plan_schema, plan_to_json
from planner.artifacts.profile import load_profile, profile_to_json
from planner.artifacts.report import VERSION as REPORT_VERSION
from planner.artifacts.report import RunReport, StageRecord, StepRecord, load_report, report_to_json
from planner.artifacts.request import PlanRequest

ROOT = Path(__file__).resolve().parents[1]
CPU_LIMIT_S = 5.0
HANG_S = 20.0
#: keys whose values are free-form data, not fields of the format
FREE_FORM = frozenset({"metadata", "versions", "sources"})
#: fields where a negative number is meaningful (refused only out of range)
NEGATIVE_OK = frozenset({"intercept_ms"})
#: numbers no field of any document accepts (negative ones: see NEGATIVE_OK)
HUGE = (1e308, 2**100, 1.7976931348623157e308, -1e9)
JUNK: tuple[Any, ...] = (None, True, "x", [], {}, 0, 1.5, [1, 2], {"a": 1}, "")

PIPEDREAM_GRAPH = (
    "node1 -- Input -- forward_compute_time=5.0, backward_compute_time=0.000, activation_size=1204224.0, parameter_size=0.000\n"
    "node2 -- Conv2d(3, 8) -- forward_compute_time=2.0, backward_compute_time=4.0, activation_size=[64.0; 64.0], "
    "parameter_size=16.0\n"
    "node3 -- __getitem__(0) -- forward_compute_time=0.0, backward_compute_time=0.0, activation_size=64.0, parameter_size=0.0\n"
    "node4 -- ReLU -- forward_compute_time=1.0, backward_compute_time=1.0, activation_size=32.0, parameter_size=0.0\n"
    "\tnode1 -- node2\n"
    "\tnode2 -- node4\n"
    "\tnode2 -- node3\n"
)


@dataclasses.dataclass(frozen=True)
class Loader:
    """A loader under test: the valid file it reads, how it reads one, what it must hold."""

    name: str
    text: str
    load: Callable[[Path], Any]
    json: bool = True
    schema: dict[str, Any] | None = None
    #: for files without a schema (configs): keys whose poisoned values must be refused
    sized: frozenset[str] = frozenset()


@dataclasses.dataclass(frozen=True)
class Mutant:
    kind: str
    data: bytes
    must_refuse: bool
    same_as_valid: bool = False  # a BOM: must load, and equal the valid file's document


def _report_doc(plan: Any) -> dict[str, Any]:
    stages = tuple(
        StageRecord(stage_idx=s.stage_idx, ranks=s.ranks, compute_ms=1.0, idle_ms=0.5,
                    compute_ms_predicted=plan.num_microbatches // s.replicas * (s.fwd_ms + s.bwd_ms + s.recompute_ms),
                    compute_rel_error=0.0, saved_bytes_peak=100, activation_bytes_predicted=100, activation_rel_error=0.0)
        for s in plan.stages
    )
    report = RunReport(
        model=plan.provenance.model, plan_fingerprint_sha256="", world_size=plan.num_devices, backend="gloo", device="cpu",
        dtype=DType.FLOAT32, optimizer=OptimizerFamily.SGD, emulate=False, layout=plan.layout,
        num_microbatches=plan.num_microbatches, microbatch_size=plan.microbatch_size, schedule=plan.schedule, warmup_steps=0,
        steps=(StepRecord(step_idx=0, loss=2.5, wall_ms=3.0),), stages=stages, iteration_ms=3.0,
        iteration_ms_predicted=plan.predicted.iteration_ms,
        iteration_rel_error=(3.0 - plan.predicted.iteration_ms) / plan.predicted.iteration_ms,
    )
    return report_to_json(report)


def _schema(name: str) -> dict[str, Any]:
    return json.loads((ROOT / "planner" / "schemas" / name).read_text())


def loaders() -> dict[str, Loader]:
    """Every loader of the planner, each with a valid file of its kind."""
    from planner.commands.profile import analytic_hf_profile
    from planner.models.hf_spec import SIZE_LIMITS
    from planner.models.spec import check_spec
    from planner.profiling.imported.pipedream import import_pipedream
    from planner.solve import plan
    from tests.chains import chain_profile, small_cluster

    prof = chain_profile([dict(fwd=1, bwd=2, params=1000, saved=1e6, inp=1e5, out=1e5)] * 3)
    pl = plan(prof, small_cluster(2), PlanRequest(global_batch=4))
    config = (ROOT / "configs" / "llama-3-8b.json").read_text()
    sized = frozenset(SIZE_LIMITS)

    def dump(doc: dict[str, Any]) -> str:
        return json.dumps(doc, indent=1)

    profile_doc = profile_to_json(prof)  # written at the oldest version that holds it (3: nothing of 4's used)
    return {
        "profile": Loader(name="profile", text=dump(profile_doc), load=load_profile,
                          schema=_schema(f"profile.v{profile_doc['version']}.schema.json")),
        "cluster": Loader(name="cluster", text=dump(cluster_to_json(PRESETS["a100-80gb-2x8"])), load=load_cluster,
                          schema=_schema("cluster.v1.schema.json")),
        "plan": Loader(name="plan", text=dump(plan_to_json(pl)), load=load_plan, schema=plan_schema()),
        "runreport": Loader(name="runreport", text=dump(_report_doc(pl)), load=load_report,
                            schema=_schema(f"runreport.v{REPORT_VERSION}.schema.json")),
        "pipedream": Loader(name="pipedream", text=PIPEDREAM_GRAPH, load=import_pipedream, json=False),
        "hf-config": Loader(name="hf-config", text=config, load=lambda p: check_spec(f"hf:{p}"), sized=sized),
        "analytic-config": Loader(name="analytic-config", text=config, sized=sized,
                                  load=lambda p: analytic_hf_profile(str(p), seq=2048, device_preset="h100-80gb")),
    }


# ---------------------------------------------------------------- JSON mutations


def _positions(doc: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[tuple[Any, ...], Any]]:
    yield path, doc
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _positions(v, (*path, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _positions(v, (*path, i))


def _set(doc: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return doc


def _free(path: tuple[Any, ...]) -> bool:
    return any(isinstance(k, str) and k in FREE_FORM for k in path)


def _valid_json(text: str) -> bool:
    try:
        json.loads(text, parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    except (ValueError, RecursionError):
        return False
    return True


class _Validator:
    def __init__(self, schema: dict[str, Any] | None) -> None:
        self.validator = None
        if schema is not None:
            import jsonschema

            self.validator = jsonschema.Draft202012Validator(schema)

    def breaks(self, doc: Any) -> bool:
        if self.validator is None:
            return False
        try:
            return not self.validator.is_valid(doc)
        except RecursionError:
            return True


def _dump_with_duplicate(doc: Any, target: tuple[Any, ...], value: Any) -> str:
    """JSON text of ``doc`` whose object at ``target`` repeats its first key (with ``value``)."""

    def emit(node: Any, path: tuple[Any, ...]) -> str:
        if isinstance(node, dict):
            items = [f"{json.dumps(k)}: {emit(v, (*path, k))}" for k, v in node.items()]
            if path == target and node:
                first = next(iter(node))
                items.append(f"{json.dumps(first)}: {json.dumps(value)}")
            return "{" + ", ".join(items) + "}"
        if isinstance(node, list):
            return "[" + ", ".join(emit(v, (*path, i)) for i, v in enumerate(node)) + "]"
        return json.dumps(node)

    return emit(doc, ())


def json_mutants(loader: Loader, rng: random.Random, count: int) -> Iterator[Mutant]:
    """``count`` mutants of ``loader``'s valid JSON file, cycling through the classes."""
    base = json.loads(loader.text)
    schema = _Validator(loader.schema)
    kinds = ("truncate", "non_utf8", "bom", "empty", "duplicate_key", "surrogate", "constant", "type_swap", "delete",
             "extra_key", "deep", "long_string", "huge")
    for i in range(count):
        kind = kinds[i % len(kinds)]
        yield _json_mutant(kind, loader, base, schema, rng)


def _json_mutant(kind: str, loader: Loader, base: Any, schema: _Validator, rng: random.Random) -> Mutant:
    text = loader.text
    doc = copy.deepcopy(base)
    positions = [p for p, _ in _positions(doc) if p]
    if kind == "truncate":
        cut = text[: rng.randrange(1, len(text))]
        return Mutant(kind, cut.encode(), not _valid_json(cut))
    if kind == "non_utf8":
        raw = text.encode()
        at = rng.randrange(len(raw))
        return Mutant(kind, raw[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"]) + raw[at:], True)
    if kind == "bom":
        return Mutant(kind, b"\xef\xbb\xbf" + text.encode(), False, same_as_valid=True)
    if kind == "empty":
        return Mutant(kind, rng.choice([b"", b"   \n", b"\n"]), True)
    if kind == "duplicate_key":
        objects = [p for p, v in _positions(doc) if isinstance(v, dict) and v]
        return Mutant(kind, _dump_with_duplicate(doc, rng.choice(objects), rng.choice(JUNK)).encode(), True)
    if kind == "surrogate":
        strings = [p for p, v in _positions(doc) if isinstance(v, str)]
        if strings and rng.random() < 0.7:
            path = rng.choice(strings)
            _set(doc, path, "\ud800" + _get(doc, path))
        else:
            objects = [p for p, v in _positions(doc) if isinstance(v, dict)]
            _get(doc, rng.choice(objects))["k\udc00"] = 1
        return Mutant(kind, json.dumps(doc).encode(), True)  # ensure_ascii: written as the escape \ud800
    if kind == "constant":
        numbers = [p for p, v in _positions(doc) if isinstance(v, (int, float)) and not isinstance(v, bool)]
        path = rng.choice(numbers or positions)
        _set(doc, path, "@@CONSTANT@@")
        literal = rng.choice(["NaN", "Infinity", "-Infinity", "1e400", "-1e400"])
        return Mutant(kind, json.dumps(doc).replace('"@@CONSTANT@@"', literal).encode(), True)
    if kind == "huge":
        path = rng.choice(positions)
        value = rng.choice(HUGE)
        key = next((k for k in reversed(path) if isinstance(k, str)), "")
        must = not _free(path) and not (value < 0 and key in NEGATIVE_OK)
        if not loader.schema:  # configs: only their size fields are held to a range
            must = key in loader.sized and len(path) == 1
        _set(doc, path, value)
        return Mutant(kind, json.dumps(doc).encode(), must)
    if kind == "type_swap":
        path = rng.choice(positions)
        old = _get(doc, path)
        value = rng.choice([j for j in JUNK if type(j) is not type(old)])
        _set(doc, path, copy.deepcopy(value))
        must = schema.breaks(doc) or (not loader.schema and len(path) == 1 and (
            path[0] == "model_type" or (path[0] in loader.sized and value is not None)))
        return Mutant(kind, json.dumps(doc).encode(), must)
    if kind == "delete":
        path = rng.choice(positions)
        parent = _get(doc, path[:-1])
        del parent[path[-1]]
        return Mutant(kind, json.dumps(doc).encode(), schema.breaks(doc) or (not loader.schema and path == ("model_type",)))
    if kind == "extra_key":
        objects = [p for p, v in _positions(doc) if isinstance(v, dict)]
        _get(doc, rng.choice(objects))[rng.choice(["extra", "🙂", "a\nb", "x.y", "\x00", "schema2"])] = rng.choice(JUNK)
        return Mutant(kind, json.dumps(doc).encode(), schema.breaks(doc))
    if kind == "deep":
        path = rng.choice(positions)
        depth = rng.choice([50, 1000, 100_000])
        if depth > 900:  # past json's recursion: built as text
            text = json.dumps(_set(doc, path, "@@DEEP@@")).replace('"@@DEEP@@"', "[" * depth + "]" * depth)
            return Mutant(kind, text.encode(), True)
        nested: Any = 1
        for _ in range(depth):
            nested = [nested]
        _set(doc, path, nested)
        return Mutant(kind, json.dumps(doc).encode(), schema.breaks(doc) or (not loader.schema and len(path) == 1 and (
            path[0] == "model_type" or path[0] in loader.sized)))
    if kind == "long_string":
        path = rng.choice(positions)
        _set(doc, path, "x" * rng.choice([10**4, 10**6]))
        must = schema.breaks(doc) or (not loader.schema and len(path) == 1 and (path[0] in loader.sized))
        return Mutant(kind, json.dumps(doc).encode(), must)
    raise ValueError(kind)


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


# ---------------------------------------------------------------- text mutations (graph.txt)


def text_mutants(loader: Loader, rng: random.Random, count: int) -> Iterator[Mutant]:
    kinds = ("truncate", "drop_line", "non_utf8", "empty", "poison_number", "duplicate_node", "bom", "long_line")
    lines = loader.text.splitlines(keepends=True)
    for i in range(count):
        kind = kinds[i % len(kinds)]
        text = loader.text
        if kind == "truncate":
            yield Mutant(kind, text[: rng.randrange(1, len(text))].encode(), False)
        elif kind == "drop_line":
            keep = list(lines)
            del keep[rng.randrange(len(keep))]
            yield Mutant(kind, "".join(keep).encode(), False)
        elif kind == "non_utf8":
            raw = text.encode()
            at = rng.randrange(len(raw))
            yield Mutant(kind, raw[:at] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"]) + raw[at:], True)
        elif kind == "empty":
            yield Mutant(kind, rng.choice([b"", b"\n\n"]), True)
        elif kind == "poison_number":
            keys = ["forward_compute_time", "backward_compute_time", "parameter_size", "activation_size"]
            key = rng.choice(keys)
            node = rng.choice([ln for ln in lines if key in ln and not ln.startswith("\t")])
            value = rng.choice(["nan", "inf", "-inf", "1e400", "-1", "1e308", "abc", ""])
            head, _, rest = node.partition(key + "=")
            if rest.startswith("["):  # a tuple output [a; b]: the whole list
                tail = rest[rest.index("]") + 1:]
            else:
                _, comma, after = rest.partition(",")
                tail = comma + after if comma else "\n"
            new = f"{head}{key}={value}{tail}"
            yield Mutant(kind, text.replace(node, new).encode(), True)
        elif kind == "duplicate_node":
            node = rng.choice([ln for ln in lines if not ln.startswith("\t")])
            yield Mutant(kind, (node + text).encode(), True)
        elif kind == "bom":
            yield Mutant(kind, b"\xef\xbb\xbf" + text.encode(), False, same_as_valid=True)
        else:  # a description 10^6 characters long
            node = rng.choice([ln for ln in lines if " -- " in ln and not ln.startswith("\t")])
            parts = node.split(" -- ")
            yield Mutant(kind, text.replace(node, " -- ".join([parts[0], "y" * 10**6, *parts[2:]])).encode(), False)


def mutants(loader: Loader, rng: random.Random, count: int) -> Iterator[Mutant]:
    return json_mutants(loader, rng, count) if loader.json else text_mutants(loader, rng, count)


# ---------------------------------------------------------------- running one


class _Hang(BaseException):
    pass


@contextmanager
def _alarm(seconds: float) -> Iterator[None]:
    def fire(signum: int, frame: Any) -> None:
        raise _Hang

    old = signal.signal(signal.SIGALRM, fire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclasses.dataclass(frozen=True)
class Outcome:
    problem: str  # "" when the loader behaved
    refused: bool
    cpu_s: float


def run_one(loader: Loader, path: Path, *, must_refuse: bool, expect: Any = None) -> Outcome:
    """Load ``path`` with ``loader``; classify (see the module docstring)."""
    cpu = time.process_time()
    try:
        with _alarm(HANG_S):
            result = loader.load(path)
    except _Hang:
        return Outcome(f"hang: more than {HANG_S} s", False, time.process_time() - cpu)
    except PlannerInputError as exc:
        used = time.process_time() - cpu
        text = str(exc)
        if "\n" in text:
            return Outcome(f"multi-line message: {text[:200]!r}", True, used)
        if str(path) not in text and path.name not in text:
            return Outcome(f"message does not name the file: {text[:200]!r}", True, used)
        return Outcome("" if used <= CPU_LIMIT_S else f"slow refusal: {used:.1f} s CPU", True, used)
    except BaseException as exc:  # the crash the fuzz looks for
        return Outcome(f"crash: {type(exc).__name__}: {str(exc)[:200]}", False, time.process_time() - cpu)
    used = time.process_time() - cpu
    if must_refuse:
        return Outcome("silent acceptance", False, used)
    if expect is not None and result != expect:
        return Outcome("accepted, but not the same document as the valid file", False, used)
    return Outcome("" if used <= CPU_LIMIT_S else f"slow: {used:.1f} s CPU", False, used)


def run_mutants(loader: Loader, folder: Path, count: int, seed: int) -> Iterator[tuple[Mutant, Outcome]]:
    """Every mutant of ``loader`` written to ``folder`` and loaded."""
    rng = random.Random(seed)
    name = "config.json" if "config" in loader.name else f"{loader.name}.json" if loader.json else "graph.txt"
    for i, mutant in enumerate(mutants(loader, rng, count)):
        path = folder / f"m{i}-{name}"
        expect = None
        if mutant.same_as_valid:  # what the valid file loads as, from the same path (some loaders record it)
            path.write_text(loader.text)
            expect = loader.load(path)
        path.write_bytes(mutant.data)
        yield mutant, run_one(loader, path, must_refuse=mutant.must_refuse, expect=expect)
        path.unlink()


@contextmanager
def special_files(folder: Path) -> Iterator[dict[str, Path]]:
    """A FIFO, ``/dev/zero``, a directory, a socket and an empty file, by kind."""
    fifo = folder / "fifo.json"
    os.mkfifo(fifo)
    directory = folder / "dir.json"
    directory.mkdir()
    empty = folder / "empty.json"
    empty.write_bytes(b"")
    sock_path = folder / "sock.json"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(sock_path))
    try:
        yield {"fifo": fifo, "dev_zero": Path("/dev/zero"), "directory": directory, "socket": sock_path, "empty": empty}
    finally:
        sock.close()


