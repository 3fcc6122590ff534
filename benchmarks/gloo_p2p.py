"""Measure gloo point-to-point latency and bandwidth over loopback (2 processes).

    python -m torch.distributed.run --standalone --nproc-per-node 2 benchmarks/gloo_p2p.py

Ping-pong between rank 0 and rank 1: half the round-trip time of a message of n bytes is
alpha + n / beta; alpha from the smallest message, beta from a least-squares line over the
larger ones. These are the numbers behind the ``local-cpu`` cluster preset.
"""

from __future__ import annotations

import statistics
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist

SIZES = [4, 4096, 65536, 1 << 20, 4 << 20, 16 << 20]
REPEATS = 20


def one_way_s(num_bytes: int, rank: int) -> float:
    buf = torch.zeros(max(1, num_bytes // 4), dtype=torch.float32)
    peer = 1 - rank
    times = []
    for _ in range(REPEATS + 2):
        dist.barrier()
        start = time.perf_counter()
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        else:
            dist.recv(buf, peer)
            dist.send(buf, peer)
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times[2:])


def one_way_batched_s(num_bytes: int, rank: int) -> float:
    """Half round trip with ``batch_isend_irecv`` + wait, as torch.distributed.pipelining does."""
    buf = torch.zeros(max(1, num_bytes // 4), dtype=torch.float32)
    peer = 1 - rank
    times = []
    for _ in range(REPEATS + 2):
        dist.barrier()
        time.sleep(0.002)  # like a pipeline stage, the receiver arrives first and blocks
        start = time.perf_counter()
        if rank == 0:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer)]):
                work.wait()
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer)]):
                work.wait()
        else:
            for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, peer)]):
                work.wait()
            for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, buf, peer)]):
                work.wait()
        times.append((time.perf_counter() - start) / 2)
    return statistics.median(times[2:])


def main() -> None:
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    rank = dist.get_rank()
    results = [(n, one_way_s(n, rank)) for n in SIZES]
    if rank == 0:
        print(f"{'bytes':>10} {'one-way us':>11} {'GB/s':>7}")
        for n, t in results:
            print(f"{n:>10} {t * 1e6:>11.1f} {n / t / 1e9:>7.3f}")
        big = [(n, t) for n, t in results if n >= 65536]
        slope, _ = np.polyfit([n for n, _ in big], [t for _, t in big], 1)
        print(f"alpha (4-byte one-way) = {results[0][1] * 1e6:.1f} us; beta (fit) = {1 / slope / 1e9:.3f} GB/s")
    batched = [(n, one_way_batched_s(n, rank)) for n in SIZES[:3]]
    if rank == 0:
        for n, t in batched:
            print(f"batch_isend_irecv {n:>8} B one-way {t * 1e6:.1f} us")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
