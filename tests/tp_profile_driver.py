"""Run zoo transformer layers sharded over the ranks of one gloo group (tensor parallelism)
and count what each rank saves for backward and holds as parameters, beside the
declaration the profiler makes (``planner.profiling.measured.tensor_split``).

    torchrun --nproc-per-node T tests/tp_profile_driver.py SPECS.json OUT.json

SPECS.json is a list of zoo model specs. For every layer the workload splits, with and
without sequence parallelism, rank 0 writes: the declared whole and split saved bytes and
parameters of the layer, and per rank the measured saved bytes (``SavedBytesMeter``, the
runtime's meter: parameters excluded, a DTensor counted by its local shard) and parameter
elements (local shards).
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.models import load_workload
from planner.profiling.measured.tensor_split import count_split, device_split_bytes, split_kinds, split_param_count
from planner.runtime.memory import SavedBytesMeter
from planner.runtime.tensor import local, parallelize_layers

BATCH = 2


def _fresh(x: Any) -> Any:
    """A layer's input as the model hands it on: floating tensors needing grad, the rest
    (a Hugging Face block's padding mask) as they are."""
    if isinstance(x, tuple):
        return tuple(_fresh(t) for t in x)
    return x.detach().requires_grad_(x.is_floating_point())


def measure(spec: str, t: int, mesh: Any) -> list[dict[str, Any]]:
    rows = []
    for sp in (False, True):
        whole = load_workload(spec)  # declarations from the unsharded layers
        split = load_workload(spec)
        x = whole.make_batch(BATCH, 0)[0]
        for idx, (layer, name) in enumerate(zip(whole.layers, whole.layer_names)):
            styles = whole.tensor_parallel.styles(layer, False) if whole.tensor_parallel else None
            if styles:
                count = count_split(layer, styles, _fresh(x))
                device = device_split_bytes(layer, whole.tensor_parallel, split_kinds(styles), _fresh(x), t, name)
                parallelize_layers(split, [idx], mesh, sp)
                sharded = split.layers[idx]
                meter = SavedBytesMeter(list(sharded.parameters()))
                with meter.hooks():
                    out = sharded(_fresh(x))
                mine = torch.tensor(
                    [meter.live_bytes, sum(local(p).numel() for p in sharded.parameters())], dtype=torch.float64
                )
                every = [torch.zeros_like(mine) for _ in range(t)]
                dist.all_gather(every, mine)
                (out[0] if isinstance(out, tuple) else out).sum().backward()
                rows.append(
                    {
                        "spec": spec,
                        "layer": name,
                        "sequence_parallel": sp,
                        "saved_bytes": count.saved_bytes,
                        "split_saved_bytes": count.split_saved_bytes,
                        "column_input_bytes": count.column_input_bytes,
                        "sequence_saved_bytes": count.sequence_saved_bytes,
                        "device_split_bytes": device,
                        "param_count": sum(p.numel() for p in layer.parameters()),
                        "split_param_count": split_param_count(layer, styles),
                        "measured_saved_bytes": [int(r[0]) for r in every],
                        "measured_param_count": [int(r[1]) for r in every],
                    }
                )
            with torch.no_grad():
                x = layer(x)
    return rows


def main() -> None:
    specs = json.loads(Path(sys.argv[1]).read_text())
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    t = dist.get_world_size()
    mesh = init_device_mesh("cpu", (t,), mesh_dim_names=("tp",))
    rows = [row for spec in specs for row in measure(spec, t, mesh)]
    if dist.get_rank() == 0:
        Path(sys.argv[2]).write_text(json.dumps(rows, indent=2))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
