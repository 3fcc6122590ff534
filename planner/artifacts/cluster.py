"""The Cluster artifact and its presets.

Bandwidths are in GB/s (10^9 bytes per second) per direction, latencies in microseconds.
``relative_speed`` scales the profile's compute times: a layer profiled at ``t`` ms runs in
``t / relative_speed`` ms on this cluster's devices (1.0: the profile was measured on this
kind of device). Every preset number has a source in ``sources``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from planner.artifacts import codec
from planner.artifacts.devices import newer_preset_fields
from planner.artifacts.errors import PlannerInputError
from planner.artifacts.kinds import CollectiveModel
from planner.artifacts.limits import MAX_BYTES, MAX_DEVICES, MAX_MS, MAX_RATE, MIN_RATE, check_count, check_name, check_range

SCHEMA = "planner.cluster"
VERSION = 1

GIB = 1024**3


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """Nodes of identical devices joined by a fast intra-node and a slower inter-node link."""

    name: str
    device_name: str
    num_nodes: int
    devices_per_node: int
    device_memory_bytes: int
    relative_speed: float = 1.0
    intra_node_bandwidth_gb_per_s: float
    intra_node_latency_us: float
    inter_node_bandwidth_gb_per_s: float
    inter_node_latency_us: float
    peak_tflops: float = field(
        default=0.0, metadata={"doc": "peak dense 16-bit FLOP/s of one device, in 10^12 (for MFU); 0 = unknown"}
    )
    peak_fp8_tflops: float = field(
        default=0.0, metadata={"doc": "peak dense FP8 FLOP/s of one device, in 10^12 (the FP8 precisions' GEMMs: "
                                      "planner.cost.precision); 0 = no FP8 tensor cores (absent when 0)",
                               "omit_if_default": True}
    )
    mxfp8: bool = field(
        default=False, metadata={"doc": "the device's tensor cores scale FP8 blocks of 32 in hardware (MXFP8, "
                                        "OCP Microscaling; Blackwell) (absent when false)", "omit_if_default": True}
    )
    memory_bandwidth_gb_per_s: float = field(
        default=0.0,
        metadata={"doc": "device memory (HBM) bandwidth of one device, GB/s: prices the optimizer step (bytes it "
                         "streams / this); 0 = unknown, the step not priced"},
    )
    overlap_compute_loss: float = field(
        default=0.0,
        metadata={"doc": "the share of a device's compute a collective running beside it takes (the SMs its kernels "
                         "hold): a tensor-parallel collective hidden behind GEMMs for c ms lengthens them by this x c; "
                         "0 = overlap is free"},
    )
    collective_model: CollectiveModel = field(
        default=CollectiveModel.ALPHA_BETA,
        metadata={"doc": "how collectives across nodes are priced: alpha-beta rings, or NCCL's tuning model (its "
                         "latencies and ring / tree choice; planner.cost.collectives) (absent when alpha-beta)",
                  "omit_if_default": True},
    )
    inter_node_p2p_latency_us: float = field(
        default=0.0,
        metadata={"doc": "a pipeline send/receive between nodes, its fixed time (us) as NCCL's send/recv measures it "
                         "for small messages; 0 = inter_node_latency_us (absent when 0)", "omit_if_default": True},
    )
    gpu_speed_variation: float = field(
        default=0.0,
        metadata={"doc": "spread of per-GPU speed over the cluster's GPUs of one model ((slowest - fastest) / median): "
                         "a synchronous job waits for its slowest GPU (planner.cost.overheads); 0 = not priced "
                         "(absent when 0)", "omit_if_default": True},
    )
    host_link_gb_per_s: float = field(
        default=0.0,
        metadata={"doc": "one device's link to host memory, GB/s per direction (PCIe, or NVLink-C2C on Grace parts): "
                         "prices offloading (planner.cost.offload); 0 = the device's datasheet figure "
                         "(planner.artifacts.host) (absent when 0)", "omit_if_default": True},
    )
    host_memory_bytes: int = field(
        default=0,
        metadata={"doc": "host memory of one node that offloaded state may use; 0 = the device's node's datasheet "
                         "figure (planner.artifacts.host) (absent when 0)", "omit_if_default": True},
    )
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("num_nodes", "devices_per_node", "device_memory_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1 (got {getattr(self, name)})")
        for name in ("relative_speed", "intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be > 0 (got {value!r})")
        for name in ("intra_node_latency_us", "inter_node_latency_us", "peak_tflops", "peak_fp8_tflops",
                     "memory_bandwidth_gb_per_s"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be >= 0 (got {value!r})")
        check_name("name", self.name)
        check_count("num_nodes", self.num_nodes, 1, MAX_DEVICES)
        check_count("devices_per_node", self.devices_per_node, 1, MAX_DEVICES)
        check_count("num_nodes x devices_per_node", self.num_nodes * self.devices_per_node, 1, MAX_DEVICES)
        check_count("device_memory_bytes", self.device_memory_bytes, 1, MAX_BYTES)
        # rates divide: a denormal one makes inf as surely as a huge time (limits.MIN_RATE)
        for name in ("relative_speed", "intra_node_bandwidth_gb_per_s", "inter_node_bandwidth_gb_per_s"):
            check_range(name, getattr(self, name), MIN_RATE, MAX_RATE)
        for name in ("peak_tflops", "peak_fp8_tflops", "memory_bandwidth_gb_per_s"):
            if getattr(self, name):  # 0 = unknown
                check_range(name, getattr(self, name), MIN_RATE, MAX_RATE)
        for name in ("intra_node_latency_us", "inter_node_latency_us"):
            check_range(name, getattr(self, name), 0, MAX_MS)
        if not (math.isfinite(self.overlap_compute_loss) and 0 <= self.overlap_compute_loss < 1):
            raise ValueError(f"overlap_compute_loss must be in [0, 1) (got {self.overlap_compute_loss!r})")
        if not (math.isfinite(self.gpu_speed_variation) and 0 <= self.gpu_speed_variation < 1):
            raise ValueError(f"gpu_speed_variation must be in [0, 1) (got {self.gpu_speed_variation!r})")
        check_range("inter_node_p2p_latency_us", self.inter_node_p2p_latency_us, 0, MAX_MS)
        if self.host_link_gb_per_s:
            check_range("host_link_gb_per_s", self.host_link_gb_per_s, MIN_RATE, MAX_RATE)
        check_count("host_memory_bytes", self.host_memory_bytes, 0, MAX_BYTES)
        object.__setattr__(self, "collective_model", CollectiveModel(self.collective_model))

    @property
    def num_devices(self) -> int:
        return self.num_nodes * self.devices_per_node

    def node_of(self, rank: int) -> int:
        return rank // self.devices_per_node

    def with_devices(self, num_devices: int) -> Cluster:
        """This cluster grown or shrunk to ``num_devices`` (whole nodes, or part of one)."""
        if num_devices < 1:
            raise PlannerInputError(f"--devices must be >= 1 (got {num_devices})")
        if num_devices <= self.devices_per_node:
            return replace(self, num_nodes=1, devices_per_node=num_devices)
        if num_devices % self.devices_per_node:
            raise PlannerInputError(
                f"--devices {num_devices} is not a whole number of {self.devices_per_node}-device nodes "
                f"of cluster {self.name!r}"
            )
        return replace(self, num_nodes=num_devices // self.devices_per_node)

    def grown_to(self, num_devices: int) -> Cluster:
        """This cluster with as many of its nodes as ``num_devices`` needs (at least its own):
        ``h100-80gb-x8`` grown to 64 devices is 8 such nodes, to 12 devices 2 nodes (the plan then
        says it may use 12 of the 16)."""
        if num_devices <= self.num_devices:
            return self
        check_count("devices", num_devices, 1, MAX_DEVICES)
        return replace(self, num_nodes=-(-num_devices // self.devices_per_node))


_NVIDIA_A100 = "NVIDIA A100 datasheet (80GB SXM: 80 GB HBM2e, NVLink 600 GB/s total = 300 GB/s per direction)"
_NVIDIA_H100 = "NVIDIA H100 datasheet (SXM5: 80 GB HBM3, NVLink 900 GB/s total = 450 GB/s per direction)"
#: device memory of the "80 GB" parts as the CUDA runtime reports it (``torch.cuda.get_device_properties(0).
#: total_memory``, the "total capacity" of PyTorch's out-of-memory message): what one process can allocate
#: in, CUDA context included. Not the datasheet's 80 GB read as 80e9 bytes (74.51 GiB), which left ~4.6 GiB
#: of every GPU unplanned (benchmarks/RESULTS.md section 39).
_A100_80GB_CUDA_BYTES = int(79.14 * GIB)
_H100_80GB_CUDA_BYTES = int(79.11 * GIB)
_A100_MEMORY = ("CUDA-reported total of an A100-SXM4-80GB: 79.14 GiB (PyTorch OOM messages, CUDA 12; 79.35 GiB "
                "under older drivers) of its 80 GiB HBM2e")
_H100_MEMORY = "CUDA-reported total of an H100 80GB HBM3 (SXM5): 79.11 GiB (PyTorch OOM messages; nvidia-smi 81,559 MiB)"
#: the SMs an NCCL collective's kernels hold while it runs beside a GEMM (NVIDIA developer forum,
#: "Compute-communication overlap causes severe GEMM performance degradation because of tail effect", 2025)
_NCCL_BLOCKS = 24
_A100_SMS, _H100_SMS = 108, 132


def _overlap_loss_source(sms: int) -> str:
    return (f"an NCCL collective's {_NCCL_BLOCKS} thread blocks (an all-gather beside a GEMM on an H100, NVIDIA "
            f"developer forum 2025) of the device's {sms} SMs: the GEMMs beside it run on the rest")


_V100 = "NVIDIA V100 datasheet (16 GB HBM2); PipeDream (SOSP'19) cluster B/C: 8 GPUs per server, 25 Gbps between servers"
_NCCL_LAT = "NCCL tests: ~10 us intra-node NVLink small-message latency"
_IB_HDR = "Mellanox HDR InfiniBand 200 Gb/s per NIC x 8 NICs (DGX A100) = 200 GB/s per node, ~25 GB/s per GPU; ~5 us latency"
_IB_NDR = "ConnectX-7 NDR 400 Gb/s per GPU (DGX H100) = 50 GB/s per GPU"
#: NCCL's send/recv between two nodes over InfiniBand for 256 B - 8 KiB messages: 30.7-34.2 us
#: (nccl-tests sendrecv_perf, NVIDIA/nccl-tests issue #214, 2024)
_NCCL_P2P_NET_US = 31.0
_NCCL_P2P = ("nccl-tests sendrecv_perf between two nodes over InfiniBand, 256 B - 8 KiB: 30.7-34.2 us "
             "(NVIDIA/nccl-tests issue #214, 2024): 31 us")
_NCCL_MODEL = "NCCL's tuning model (NVIDIA/nccl src/graph/tuning.cc at 5067397): ring / tree latencies and choice"
#: Sinha et al., "Not All GPUs Are Created Equal: Characterizing Variability in Large-Scale, Accelerator-Rich
#: Systems" (SC'22): GPUs of one SKU in a cluster vary by 8% on average (max 22%) in performance
_GPU_VARIATION = 0.08
_SINHA = ("Sinha et al. SC'22 'Not All GPUs Are Created Equal': 8% average (max 22%) performance variation across "
          "a cluster's GPUs of one SKU")


def _preset(**kw: Any) -> Cluster:
    return Cluster(**kw)


PRESETS: dict[str, Cluster] = {
    "a100-80gb-x8": _preset(
        name="a100-80gb-x8",
        device_name="NVIDIA A100-SXM4-80GB",
        num_nodes=1,
        devices_per_node=8,
        device_memory_bytes=_A100_80GB_CUDA_BYTES,
        intra_node_bandwidth_gb_per_s=300.0,
        intra_node_latency_us=10.0,
        inter_node_bandwidth_gb_per_s=25.0,
        inter_node_latency_us=5.0,
        peak_tflops=312.0,
        memory_bandwidth_gb_per_s=2039.0,
        overlap_compute_loss=_NCCL_BLOCKS / _A100_SMS,
        collective_model=CollectiveModel.NCCL,
        inter_node_p2p_latency_us=_NCCL_P2P_NET_US,
        gpu_speed_variation=_GPU_VARIATION,
        sources={
            "collective_model": _NCCL_MODEL,
            "inter_node_p2p_latency_us": _NCCL_P2P,
            "gpu_speed_variation": _SINHA,
            "peak_tflops": "NVIDIA A100 datasheet: 312 TFLOPS dense BF16 tensor core",
            "memory_bandwidth_gb_per_s": "NVIDIA A100 datasheet: 2,039 GB/s HBM2e (80GB SXM)",
            "device_memory_bytes": _A100_MEMORY,
            "overlap_compute_loss": _overlap_loss_source(_A100_SMS),
            "intra_node_bandwidth_gb_per_s": _NVIDIA_A100,
            "intra_node_latency_us": _NCCL_LAT,
            "inter_node_bandwidth_gb_per_s": _IB_HDR,
            "inter_node_latency_us": _IB_HDR,
        },
    ),
    "h100-80gb-x8": _preset(
        name="h100-80gb-x8",
        device_name="NVIDIA H100-SXM5-80GB",
        num_nodes=1,
        devices_per_node=8,
        device_memory_bytes=_H100_80GB_CUDA_BYTES,
        intra_node_bandwidth_gb_per_s=450.0,
        intra_node_latency_us=8.0,
        inter_node_bandwidth_gb_per_s=50.0,
        inter_node_latency_us=5.0,
        peak_tflops=989.0,
        peak_fp8_tflops=1979.0,
        memory_bandwidth_gb_per_s=3350.0,
        overlap_compute_loss=_NCCL_BLOCKS / _H100_SMS,
        collective_model=CollectiveModel.NCCL,
        inter_node_p2p_latency_us=_NCCL_P2P_NET_US,
        gpu_speed_variation=_GPU_VARIATION,
        sources={
            "collective_model": _NCCL_MODEL,
            "inter_node_p2p_latency_us": _NCCL_P2P,
            "gpu_speed_variation": _SINHA,
            "peak_tflops": "NVIDIA H100 datasheet: 989 TFLOPS dense BF16 tensor core (SXM5)",
            "peak_fp8_tflops": "NVIDIA H100 datasheet: 1,979 TFLOPS dense FP8 tensor core (SXM5; 3,958 with sparsity)",
            "memory_bandwidth_gb_per_s": "NVIDIA H100 datasheet: 3.35 TB/s HBM3 (SXM5)",
            "device_memory_bytes": _H100_MEMORY,
            "overlap_compute_loss": _overlap_loss_source(_H100_SMS),
            "intra_node_bandwidth_gb_per_s": _NVIDIA_H100,
            "intra_node_latency_us": _NCCL_LAT,
            "inter_node_bandwidth_gb_per_s": _IB_NDR,
            "inter_node_latency_us": _IB_NDR,
        },
    ),
    "v100-16gb-2x8": _preset(
        name="v100-16gb-2x8",
        device_name="NVIDIA V100-SXM2-16GB",
        num_nodes=2,
        devices_per_node=8,
        device_memory_bytes=16 * 10**9,
        intra_node_bandwidth_gb_per_s=150.0,
        intra_node_latency_us=10.0,
        inter_node_bandwidth_gb_per_s=3.125,
        inter_node_latency_us=10.0,
        peak_tflops=125.0,
        memory_bandwidth_gb_per_s=900.0,
        sources={
            "peak_tflops": "NVIDIA V100 datasheet: 125 TFLOPS FP16 tensor core (SXM2)",
            "memory_bandwidth_gb_per_s": "NVIDIA V100 datasheet: 900 GB/s HBM2 (SXM2)",
            "device_memory_bytes": _V100,
            "intra_node_bandwidth_gb_per_s": "NVIDIA V100 datasheet: NVLink 300 GB/s total = 150 GB/s per direction",
            "intra_node_latency_us": _NCCL_LAT,
            "inter_node_bandwidth_gb_per_s": _V100 + " = 3.125 GB/s",
            "inter_node_latency_us": "typical 25 GbE TCP round trip / 2",
        },
    ),
    "local-cpu": _preset(
        name="local-cpu",
        device_name="CPU process (gloo)",
        num_nodes=1,
        devices_per_node=4,
        device_memory_bytes=4 * GIB,
        intra_node_bandwidth_gb_per_s=1.7,
        intra_node_latency_us=1760.0,
        inter_node_bandwidth_gb_per_s=1.0,
        inter_node_latency_us=100.0,
        sources={
            "device_memory_bytes": "a 4 GiB share per process of a 24 GiB, 2-core development machine",
            "intra_node_bandwidth_gb_per_s": "gloo send/recv over loopback, 2 processes, 1-16 MiB messages: 1.0-2.4 GB/s, "
            "typically 1.7 (benchmarks/gloo_p2p.py, 2-core machine shared with other jobs)",
            "intra_node_latency_us": "effective pipeline hop inside a running pipeline (the receiver wakes from a "
            "blocking wait on a busy core): 1761 us fit by benchmarks/calibrate_local_cpu.py (planner.calibrate, "
            "links only) on two emulated runs held out of benchmarks/fidelity.py; an idle gloo ping-pong "
            "measures 140-165 us (benchmarks/gloo_p2p.py)",
            "inter_node_bandwidth_gb_per_s": "assumed 10 GbE-class link",
            "inter_node_latency_us": "assumed 10 GbE-class link",
        },
    ),
}

PRESETS["a100-80gb-2x8"] = replace(PRESETS["a100-80gb-x8"], name="a100-80gb-2x8", num_nodes=2)
for _name, _fields in newer_preset_fields(PRESETS["h100-80gb-x8"].sources).items():
    PRESETS[_name] = replace(PRESETS["h100-80gb-x8"], **_fields)

DEFAULT_CLUSTER = "a100-80gb-x8"


def load_cluster(name_or_path: str | Path) -> Cluster:
    """A preset by name, or a cluster JSON file."""
    key = str(name_or_path)
    if key in PRESETS:
        return PRESETS[key]
    path = Path(key)
    if not path.exists() and not key.endswith(".json"):
        raise PlannerInputError(f"unknown cluster {key!r}: not a preset ({', '.join(PRESETS)}) and not a file")
    return cluster_from_json(codec.read_json(path), str(path))


def cluster_from_json(data: Any, source: str = "<cluster>") -> Cluster:
    """A cluster document; one of an 80 GB A100 or H100 written before the presets held what
    CUDA reports (:func:`predates_memory_correction`) is refused naming the value to write."""
    cluster = codec.decode_document(Cluster, data, SCHEMA, VERSION, source)
    why = predates_memory_correction(cluster)
    if why:
        raise PlannerInputError(f"{source}: {why}")
    return cluster


#: the device memory the A100 / H100 80 GB presets gave before they held what CUDA reports
_PRE_CORRECTION_BYTES = 80 * 10**9


def predates_memory_correction(cluster: Cluster) -> str:
    """Why a cluster of 80 GB A100s or H100s with ``device_memory_bytes`` = 80e9 predates the
    correction (the datasheet's "80 GB" read as decimal bytes, 74.51 GiB, where CUDA reports 79.14 /
    79.11 GiB: benchmarks/RESULTS.md section 39); "" otherwise."""
    name = cluster.device_name.upper().replace(" ", "")
    if cluster.device_memory_bytes != _PRE_CORRECTION_BYTES or "80GB" not in name:
        return ""
    right = {"A100": _A100_80GB_CUDA_BYTES, "H100": _H100_80GB_CUDA_BYTES}
    part = next((k for k in right if k in name), "")
    if not part:
        return ""
    return (f"device_memory_bytes 80000000000 (74.51 GiB) on an {cluster.device_name} predates the correction to "
            f"what CUDA reports ({right[part] / GIB:.2f} GiB): set it to {right[part]} (or to what "
            f"torch.cuda.get_device_properties(0).total_memory reports on your GPUs)")


def cluster_to_json(cluster: Cluster) -> dict[str, Any]:
    return codec.encode_document(cluster, SCHEMA, VERSION)


def save_cluster(cluster: Cluster, path: str | Path) -> None:
    Path(path).write_text(codec.dumps_canonical(cluster_to_json(cluster)))
