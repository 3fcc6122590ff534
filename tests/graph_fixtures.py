"""Graphs in PipeDream's ``graph.txt`` format that the project writes itself (the fixtures of the
importer, the PipeDream-optimizer baseline, replication, the objectives and the golden plans).

PipeDream's published profiles are data to read from ``../shared/reference/pipedream`` by the
benchmarks only; nothing here is copied or edited from them. Each graph below is an architecture
written out layer by layer, its costs from formulas:

- shapes and parameter counts follow from the layer definitions (a ``Conv2d(ci, co, k)`` holds
  ``(k * k * ci + 1) * co`` fp32 values, an ``LSTM(i, h)`` ``4h(i + h) + 8h``);
- ``activation_size``: the output's fp32 bytes for the whole minibatch (a tuple output ``[a; b; c]``);
- forward time: a layer's FLOPs at half the fp32 peak of a V100 (15.7 TFLOP/s, NVIDIA's V100
  datasheet), 2 FLOPs a multiply-add; a layer without them (pointwise, pooling, a lookup) as a pass of its input and output
  through HBM2 at 900 GB/s (the same datasheet: memory-bound);
- backward time: twice the forward for layers counted in FLOPs (input and weight gradients, each as
  many FLOPs as the forward: Narayanan et al., SC'21, section 3.5), once the forward for the rest.

Graphs: ``cnn`` (AlexNet's layers as torchvision defines them: a chain but for the ``Size -> View``
side branch; batch 256 at 224 pixels), ``resnet`` (ResNet-18's: residual fan-out and ``Add`` joins,
1x1 downsample branches; batch 128), ``seq2seq`` (an LSTM encoder-decoder with attention, three
inputs of size 0, tuple outputs through ``__getitem__`` nodes, unused ``__getitem__(1)`` sinks,
residual ``Add``; batch 64 from the first LSTM's h_n). Nodes are written in reverse id order for
``resnet`` (PipeDream's files are not in topological order either).

Written to ``tests/data/graphs/<name>/graph.txt`` by ``python -m tests.graph_fixtures --write``;
``tests/test_pipedream.py`` checks the files are what this module writes.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data" / "graphs"
FP32 = 4
FLOP_S = 0.5 * 15.7e12  # half of a V100's fp32 peak (NVIDIA V100 datasheet)
HBM_BYTES_S = 900e9  # a V100's HBM2 bandwidth (same datasheet)


@dataclass
class GraphText:
    """A graph under construction: node lines (id, description, costs) and edges."""

    batch: int
    nodes: list[tuple[str, float, float, tuple[float, ...], float]] = field(default_factory=list)
    edges: list[tuple[int, int]] = field(default_factory=list)

    def add(self, description: str, out_bytes: float | tuple[float, ...], *, inputs: tuple[int, ...] = (),
            flops: float = 0.0, params: int = 0, in_bytes: float = 0.0) -> int:
        """A node fed by ``inputs`` (node numbers); per-sample ``out_bytes``, ``flops`` and
        ``in_bytes``; ``params`` fp32 values. Returns its number."""
        parts = out_bytes if isinstance(out_bytes, tuple) else (out_bytes,)
        if flops:
            fwd_ms = 1e3 * self.batch * flops / FLOP_S
            bwd_ms = 2 * fwd_ms
        else:
            fwd_ms = 1e3 * self.batch * (in_bytes + sum(parts)) / HBM_BYTES_S
            bwd_ms = fwd_ms
        self.nodes.append((description, fwd_ms, bwd_ms, tuple(self.batch * p for p in parts), float(params * FP32)))
        number = len(self.nodes)
        self.edges += [(i, number) for i in inputs]
        return number

    def text(self, reverse: bool = False) -> str:
        lines = []
        for n, (desc, fwd, bwd, parts, param_bytes) in enumerate(self.nodes, start=1):
            act = f"{parts[0]:.1f}" if len(parts) == 1 else "[" + "; ".join(f"{p:.1f}" for p in parts) + "]"
            lines.append(f"node{n} -- {desc} -- forward_compute_time={fwd:.3f}, backward_compute_time={bwd:.3f}, "
                         f"activation_size={act}, parameter_size={param_bytes:.3f}\n")
        if reverse:
            lines.reverse()
        return "".join(lines) + "".join(f"\tnode{a} -- node{b}\n" for a, b in self.edges)


def _conv(g: GraphText, x: int, shape: tuple[int, int, int], co: int, k: int, stride: int = 1, pad: int = 0,
          bias: bool = True) -> tuple[int, tuple[int, int, int]]:
    ci, h, w = shape
    ho, wo = (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1
    desc = f"Conv2d({ci}, {co}, kernel_size=({k}, {k}), stride=({stride}, {stride}), padding=({pad}, {pad})" + \
        ("" if bias else ", bias=False") + ")"
    node = g.add(desc, FP32 * co * ho * wo, inputs=(x,), flops=2.0 * k * k * ci * co * ho * wo,
                 params=(k * k * ci + bias) * co)
    return node, (co, ho, wo)


def _pointwise(g: GraphText, desc: str, x: int, shape: tuple[int, int, int], inputs: tuple[int, ...] = ()) -> int:
    size = FP32 * shape[0] * shape[1] * shape[2]
    return g.add(desc, size, inputs=inputs or (x,), in_bytes=size * len(inputs or (x,)))


def _pool(g: GraphText, desc: str, x: int, shape: tuple[int, int, int], k: int, stride: int,
          pad: int = 0) -> tuple[int, tuple[int, int, int]]:
    c, h, w = shape
    out = (c, (h + 2 * pad - k) // stride + 1, (w + 2 * pad - k) // stride + 1)
    return g.add(desc, FP32 * out[0] * out[1] * out[2], inputs=(x,), in_bytes=FP32 * c * h * w), out


def _linear(g: GraphText, x: int, fin: int, fout: int) -> int:
    return g.add(f"Linear(in_features={fin}, out_features={fout}, bias=True)", FP32 * fout, inputs=(x,),
                 flops=2.0 * fin * fout, params=(fin + 1) * fout)


def cnn() -> GraphText:
    """AlexNet's layers (torchvision's definition) at batch 256, 224 x 224 RGB inputs."""
    g = GraphText(batch=256)
    shape = (3, 224, 224)
    x = g.add("Input0", FP32 * 3 * 224 * 224)
    for co, k, stride, pad, pool in ((64, 11, 4, 2, True), (192, 5, 1, 2, True), (384, 3, 1, 1, False),
                                     (256, 3, 1, 1, False), (256, 3, 1, 1, True)):
        x, shape = _conv(g, x, shape, co, k, stride, pad)
        x = _pointwise(g, "ReLU(inplace)", x, shape)
        if pool:
            x, shape = _pool(g, "MaxPool2d(kernel_size=3, stride=2, padding=0)", x, shape, 3, 2)
    flat = shape[0] * shape[1] * shape[2]
    size = g.add("Size(0)", FP32 / g.batch, inputs=(x,))
    x = g.add(f"View({flat})", FP32 * flat, inputs=(x, size), in_bytes=FP32 * flat)
    for fin, fout in ((flat, 4096), (4096, 4096)):
        x = g.add("Dropout(p=0.5)", FP32 * fin, inputs=(x,), in_bytes=FP32 * fin)
        x = _linear(g, x, fin, fout)
        x = g.add("ReLU(inplace)", FP32 * fout, inputs=(x,), in_bytes=FP32 * fout)
    _linear(g, x, 4096, 1000)
    return g


def _basic_block(g: GraphText, x: int, shape: tuple[int, int, int], co: int, stride: int) -> tuple[int, tuple[int, int, int]]:
    y, out = _conv(g, x, shape, co, 3, stride, 1, bias=False)
    y = _pointwise(g, f"BatchNorm2d({co})", y, out)
    y = _pointwise(g, "ReLU(inplace)", y, out)
    y, _ = _conv(g, y, out, co, 3, 1, 1, bias=False)
    y = _pointwise(g, f"BatchNorm2d({co})", y, out)
    skip = x
    if stride != 1 or shape[0] != co:
        skip, _ = _conv(g, x, shape, co, 1, stride, 0, bias=False)
        skip = _pointwise(g, f"BatchNorm2d({co})", skip, out)
    y = _pointwise(g, "Add", y, out, inputs=(y, skip))
    return _pointwise(g, "ReLU(inplace)", y, out), out


def resnet() -> GraphText:
    """ResNet-18's layers (basic blocks [2, 2, 2, 2]) at batch 128, 224 x 224 RGB inputs."""
    g = GraphText(batch=128)
    x = g.add("Input0", FP32 * 3 * 224 * 224)
    x, shape = _conv(g, x, (3, 224, 224), 64, 7, 2, 3, bias=False)
    x = _pointwise(g, "BatchNorm2d(64)", x, shape)
    x = _pointwise(g, "ReLU(inplace)", x, shape)
    x, shape = _pool(g, "MaxPool2d(kernel_size=3, stride=2, padding=1)", x, shape, 3, 2, 1)
    for co, stride in ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1)):
        x, shape = _basic_block(g, x, shape, co, stride)
    x, shape = _pool(g, "AvgPool2d(kernel_size=7, stride=1, padding=0)", x, shape, 7, 1)
    size = g.add("Size(0)", FP32 / g.batch, inputs=(x,))
    x = g.add("View(512)", FP32 * 512, inputs=(x, size), in_bytes=FP32 * 512)
    _linear(g, x, 512, 1000)
    return g


SEQ, HIDDEN, VOCAB = 40, 768, 16000  # our seq2seq's sequence length, width and vocabulary


def _lstm(g: GraphText, x: int, fin: int, extra: tuple[int, ...] = ()) -> tuple[int, int]:
    """An LSTM(fin, HIDDEN) over SEQ steps: its tuple output (out, h_n, c_n), then
    ``__getitem__(0)`` (its output, used) and ``__getitem__(1)`` (h_n, unused: a sink)."""
    out, state = FP32 * SEQ * HIDDEN, FP32 * HIDDEN
    lstm = g.add(f"LSTM({fin}, {HIDDEN})", (out, state, state), inputs=(x, *extra),
                 flops=2.0 * SEQ * 4 * HIDDEN * (fin + HIDDEN), params=4 * HIDDEN * (fin + HIDDEN) + 8 * HIDDEN)
    first = g.add("__getitem__(0)", out, inputs=(lstm,))
    g.add("__getitem__(1)", state, inputs=(lstm,))
    return lstm, first


def seq2seq() -> GraphText:
    """An LSTM encoder-decoder with dot-product attention (our own design, GNMT's kind of model:
    Wu et al. 2016): 3 encoder and 3 decoder layers, residual adds from the third, at batch 64."""
    g = GraphText(batch=64)
    act = FP32 * SEQ * HIDDEN
    src, lengths, tgt = g.add("Input0", 0.0), g.add("Input1", 0.0), g.add("Input2", 0.0)

    def embed(tokens: int) -> int:
        e = g.add(f"Embedding({VOCAB}, {HIDDEN}, padding_idx=0)", act, inputs=(tokens,), params=VOCAB * HIDDEN)
        return g.add("Dropout(p=0.2)", act, inputs=(e,), in_bytes=act)

    x = embed(src)
    for layer in range(3):
        _, y = _lstm(g, x, HIDDEN, (lengths,) if layer == 0 else ())
        x = g.add("Add", act, inputs=(x, y), in_bytes=2 * act) if layer >= 2 else y
    memory = x
    x = embed(tgt)
    _, x = _lstm(g, x, HIDDEN)
    attn = g.add(f"Attention({HIDDEN})", act, inputs=(x, memory), flops=4.0 * SEQ * SEQ * HIDDEN + 2.0 * SEQ * HIDDEN ** 2,
                 params=HIDDEN * HIDDEN + HIDDEN)
    x = g.add("Cat(dim=2)", 2 * act, inputs=(x, attn), in_bytes=2 * act)
    for layer in range(2):
        _, y = _lstm(g, x, 2 * HIDDEN if layer == 0 else HIDDEN)
        x = g.add("Add", act, inputs=(x, y), in_bytes=2 * act) if layer >= 1 else y
    g.add(f"Linear(in_features={HIDDEN}, out_features={VOCAB}, bias=True)", FP32 * SEQ * VOCAB, inputs=(x,),
          flops=2.0 * SEQ * HIDDEN * VOCAB, params=(HIDDEN + 1) * VOCAB)
    return g


#: name -> (builder, write nodes in reverse id order)
GRAPHS: dict[str, tuple[Callable[[], GraphText], bool]] = {
    "cnn": (cnn, False), "resnet": (resnet, True), "seq2seq": (seq2seq, False),
}


def graph_text(name: str) -> str:
    build, reverse = GRAPHS[name]
    return build().text(reverse=reverse)


def graph_path(name: str) -> Path:
    """The committed ``graph.txt`` of fixture ``name``."""
    return DATA / name / "graph.txt"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--write", action="store_true", help="write tests/data/graphs/<name>/graph.txt")
    args = ap.parse_args()
    for name in GRAPHS:
        text = graph_text(name)
        nodes = sum(1 for line in text.splitlines() if not line.startswith("\t"))
        print(f"{name}: {nodes} nodes, {text.count(chr(9))} edges")
        if args.write:
            graph_path(name).parent.mkdir(parents=True, exist_ok=True)
            graph_path(name).write_text(text)


if __name__ == "__main__":
    main()
