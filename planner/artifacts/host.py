"""The host side of a device: its link to host memory and the host memory it may use, and the
offload modes a plan may choose (:class:`OffloadMode`).

A cluster may give both (``Cluster.host_link_gb_per_s``, ``Cluster.host_memory_bytes``); 0 (every
cluster file written before these fields) means "by device": :func:`host_link_gb_per_s` and
:func:`host_memory_bytes` read the device name and return the datasheet figure, with its source
(:func:`host_sources`). Bandwidths are GB/s (10^9 bytes/s) per direction, one device's share of
its own link (each GPU of a DGX has its own x16 link to a PCIe switch; a Grace Hopper / Blackwell
superchip has its own NVLink-C2C).
"""

from __future__ import annotations

import enum
from typing import Any

__all__ = ["OffloadMode", "host_link_gb_per_s", "host_memory_bytes", "host_sources"]

GIB = 1024**3
TB = 10**12


class OffloadMode(enum.Enum):
    """What a plan keeps in host memory (``planner plan --offload``): ``none``; ``optimizer``, the
    optimizer state and fp32 master weights, the step on the host (ZeRO-Offload, Ren et al. 2021);
    ``activations``, the activations a layer saves for its backward, copied to the host after its
    forward and back before its backward, per stage where the search chooses it (Megatron-Core's
    fine-grained activation offloading); ``both``; ``auto``, each of them searched, the objective
    choosing (a request's mode only: a plan records what it chose)."""

    NONE = "none"
    OPTIMIZER = "optimizer"
    ACTIVATIONS = "activations"
    BOTH = "both"
    AUTO = "auto"

    @property
    def optimizer(self) -> bool:
        return self in (OffloadMode.OPTIMIZER, OffloadMode.BOTH)

    @property
    def activations(self) -> bool:
        return self in (OffloadMode.ACTIVATIONS, OffloadMode.BOTH)


#: (device name fragment, GB/s per direction, source), the first match wins: Grace parts before the
#: GPU names they contain
_LINKS: tuple[tuple[str, float, str], ...] = (
    ("GB200", 450.0, "NVIDIA GB200 NVL72 datasheet: NVLink-C2C 900 GB/s bidirectional between Grace and each "
                     "Blackwell GPU = 450 GB/s per direction"),
    ("GH200", 450.0, "NVIDIA GH200 Grace Hopper Superchip datasheet: NVLink-C2C 900 GB/s bidirectional = 450 GB/s "
                     "per direction"),
    ("H100", 50.0, "PCIe 5.0 x16 per H100 SXM5 (DGX H100): 64 GB/s per direction raw, ~50 GB/s effective "
                   "(128b/130b coding and TLP overheads, as measured host-device copies reach)"),
    ("H200", 50.0, "PCIe 5.0 x16 per H200 SXM (HGX H200): ~50 GB/s effective per direction, as the H100"),
    ("B200", 50.0, "PCIe 5.0 x16 per B200 (DGX B200): ~50 GB/s effective per direction, as the H100"),
    ("A100", 25.0, "PCIe 4.0 x16 per A100 SXM4 (DGX A100): 32 GB/s per direction raw, ~25 GB/s effective "
                   "(pinned cudaMemcpy bandwidth on A100 hosts)"),
    ("V100", 12.0, "PCIe 3.0 x16 per V100 SXM2 (DGX-1): 16 GB/s per direction raw, ~12 GB/s effective"),
    ("CPU", 10.0, "a CPU process: the 'host' is the same memory; a memcpy share of a 2-core machine's ~10 GB/s"),
)
_DEFAULT_LINK = (25.0, "unknown device: PCIe 4.0 x16, ~25 GB/s effective per direction")

#: (device name fragment, host bytes per node, source)
_MEMORIES: tuple[tuple[str, int, str], ...] = (
    ("GB200", 36 * 480 * 10**9, "NVIDIA GB200 NVL72 datasheet: 36 Grace CPUs x 480 GB LPDDR5X (17 TB per rack)"),
    ("GH200", 480 * 10**9, "NVIDIA GH200 datasheet: 480 GB LPDDR5X per Grace"),
    ("H100", 2 * TB, "NVIDIA DGX H100 datasheet: 2 TB system memory"),
    ("H200", 2 * TB, "NVIDIA DGX H200 datasheet: 2 TB system memory"),
    ("B200", 4 * TB, "NVIDIA DGX B200 datasheet: 4 TB system memory (2 TB base)"),
    ("A100", 1 * TB, "NVIDIA DGX A100 datasheet: 1 TB system memory (2 TB option)"),
    ("V100", 512 * GIB, "NVIDIA DGX-1 datasheet: 512 GB system memory"),
    ("CPU", 24 * GIB, "the 24 GiB development machine the local-cpu preset describes"),
)
_DEFAULT_MEMORY = (1 * TB, "unknown device: 1 TB per node, as a DGX A100")


def _match(cluster: Any, table: tuple[tuple[str, Any, str], ...], default: tuple[Any, str]) -> tuple[Any, str]:
    name = str(cluster.device_name).upper().replace(" ", "")
    for fragment, value, source in table:
        if fragment in name:
            return value, source
    return default


def host_link_gb_per_s(cluster: Any) -> float:
    """One device's host link, GB/s per direction: the cluster's own, else its device's figure."""
    given = float(getattr(cluster, "host_link_gb_per_s", 0.0) or 0.0)
    return given or float(_match(cluster, _LINKS, _DEFAULT_LINK)[0])


def host_memory_bytes(cluster: Any) -> int:
    """Host memory of one node: the cluster's own, else its device's node's figure."""
    given = int(getattr(cluster, "host_memory_bytes", 0) or 0)
    return given or int(_match(cluster, _MEMORIES, _DEFAULT_MEMORY)[0])


def host_sources(cluster: Any) -> dict[str, str]:
    """Where :func:`host_link_gb_per_s` and :func:`host_memory_bytes` come from for ``cluster``."""
    out = {}
    for key, table, default in (("host_link_gb_per_s", _LINKS, _DEFAULT_LINK),
                                ("host_memory_bytes", _MEMORIES, _DEFAULT_MEMORY)):
        if getattr(cluster, key, 0):
            out[key] = cluster.sources.get(key, "the cluster file")
        else:
            out[key] = _match(cluster, table, default)[1]
    return out
