"""Cluster presets of the GPUs after the H100: H200 (141 GB), B200 and GB200 NVL72.

Each datasheet number is the datasheet's (``sources`` of each preset names it); what a
datasheet does not give is carried from the H100 preset by a stated rule, never fitted (no
published run on these devices is given to this project):

- latencies (NVLink, InfiniBand, NCCL's send/recv), NCCL's tuning model and the GPUs' speed
  variation: the H100's (same NCCL, same ConnectX-7 NICs; the NVL72's NVLink switch hop is
  taken as the H100's NVSwitch hop);
- the share of compute a collective running beside a GEMM takes: NCCL's 24 thread blocks over
  the device's SMs, as for the H100 (132 SMs on H200, 148 on B200 and GB200);
- device memory: what CUDA reports. B200: 178.35 GiB (``cudaGetDeviceProperties``'
  totalGlobalMem, pytorch/ao pull request #4002, 2026) of the datasheet's 180 GB; H200: 139.81
  GiB (PyTorch's out-of-memory message, "total capacity of 139.81 GiB") of its 141 GB; GB200:
  its datasheet's 186 GB less the B200's 1.65 GiB difference between datasheet and CUDA.

The GB200 NVL72's 72 GPUs share one NVLink domain (the NVLink switch trays): it is modelled as
one "node" of 72 devices joined by one fast link (NVLink 5, 900 GB/s per direction), the
InfiniBand between racks as the inter-node link.

The analytic GEMM model of each device (``planner.profiling.analytic.gemm``) is the H100's
fitted one carried by the rule :func:`planner.profiling.analytic.gemm.carried_from_h100` states.
"""

from __future__ import annotations

from typing import Any

__all__ = ["newer_preset_fields"]

GIB = 1024**3
_NCCL_BLOCKS = 24
_H200 = ("NVIDIA H200 Tensor Core GPU datasheet (SXM): 141 GB HBM3e, 4.8 TB/s, FP8 3,958 TFLOPS and BF16 1,979 "
         "TFLOPS with sparsity (dense: half), NVLink 900 GB/s total")
_B200 = ("NVIDIA HGX B200 datasheet (per GPU): 180 GB HBM3e, 8 TB/s, FP8/FP6 9 PFLOPS and BF16 4.5 PFLOPS with "
         "sparsity (dense: half), NVLink 5 1.8 TB/s total; pytorch/ao #4002 measures 7.68 TB/s from the "
         "driver's bus width")
_GB200 = ("NVIDIA GB200 NVL72 datasheet: 72 Blackwell GPUs, 13.4 TB HBM3e (186 GB per GPU), 576 TB/s (8 TB/s per "
          "GPU), FP8/FP6 720 PFLOPS and BF16 360 PFLOPS with sparsity (dense per GPU: 5 and 2.5 PFLOPS), NVLink "
          "130 TB/s (1.8 TB/s per GPU)")
_CX7 = "ConnectX-7 400 Gb/s per GPU (DGX H200 / DGX B200 / GB200 NVL72 compute trays) = 50 GB/s per GPU"
_NVLINK5 = "NVLink 5: 1.8 TB/s total per GPU = 900 GB/s per direction"
_MX = "OCP Microscaling (MX) v1.0: FP8 blocks of 32 scaled by an E8M0 factor, in Blackwell's tensor cores"
_CARRIED = "carried from the H100 preset (planner.artifacts.devices module docstring)"


def _overlap(sms: int) -> tuple[float, str]:
    return _NCCL_BLOCKS / sms, f"an NCCL collective's {_NCCL_BLOCKS} thread blocks of the device's {sms} SMs (as the H100's)"


def _sources(h100_sources: dict[str, str], **kw: str) -> dict[str, str]:
    carried = {k: f"{v} ({_CARRIED})" for k, v in h100_sources.items()
               if k in ("collective_model", "inter_node_p2p_latency_us", "gpu_speed_variation", "intra_node_latency_us")}
    return {**carried, **kw}


def newer_preset_fields(h100_sources: dict[str, str]) -> dict[str, dict[str, Any]]:
    """The H200, B200 and GB200 NVL72 presets as the fields each replaces in the H100 preset (the
    rest it carries: module docstring), by name; ``h100_sources`` the H100 preset's sources."""
    h200_loss, h200_why = _overlap(132)
    b_loss, b_why = _overlap(148)
    h200 = dict(
        name="h200-141gb-x8", device_name="NVIDIA H200-SXM-141GB", device_memory_bytes=int(139.81 * GIB),
        peak_tflops=989.0, peak_fp8_tflops=1979.0, memory_bandwidth_gb_per_s=4800.0, intra_node_bandwidth_gb_per_s=450.0,
        inter_node_bandwidth_gb_per_s=50.0, overlap_compute_loss=h200_loss,
        sources=_sources(h100_sources, peak_tflops=_H200 + ": 989 dense BF16", peak_fp8_tflops=_H200 + ": 1,979 dense FP8",
                         memory_bandwidth_gb_per_s=_H200 + ": 4,800 GB/s",
                         device_memory_bytes="CUDA-reported total of an H200 (141 GB HBM3e): 139.81 GiB (PyTorch's "
                                             "out-of-memory message)",
                         intra_node_bandwidth_gb_per_s=_H200 + ": 450 GB/s per direction",
                         inter_node_bandwidth_gb_per_s=_CX7, inter_node_latency_us=_CX7, overlap_compute_loss=h200_why),
    )
    b200 = dict(
        name="b200-x8", device_name="NVIDIA B200", device_memory_bytes=int(178.35 * GIB),
        peak_tflops=2250.0, peak_fp8_tflops=4500.0, mxfp8=True, memory_bandwidth_gb_per_s=8000.0,
        intra_node_bandwidth_gb_per_s=900.0, inter_node_bandwidth_gb_per_s=50.0, overlap_compute_loss=b_loss,
        sources=_sources(h100_sources, peak_tflops=_B200 + ": 2,250 dense BF16", peak_fp8_tflops=_B200 + ": 4,500 dense FP8",
                         mxfp8=_MX, memory_bandwidth_gb_per_s=_B200 + ": 8,000 GB/s",
                         device_memory_bytes="CUDA-reported total of a B200: 178.35 GiB (totalGlobalMem, "
                                             "pytorch/ao pull request #4002)",
                         intra_node_bandwidth_gb_per_s=_NVLINK5, inter_node_bandwidth_gb_per_s=_CX7,
                         inter_node_latency_us=_CX7, overlap_compute_loss=b_why),
    )
    gb200 = dict(
        b200, name="gb200-nvl72", device_name="NVIDIA GB200 (NVL72)", devices_per_node=72, num_nodes=1,
        device_memory_bytes=int((186 - 1.65) * GIB), peak_tflops=2500.0, peak_fp8_tflops=5000.0,
        sources=_sources(h100_sources, peak_tflops=_GB200 + ": 2,500 dense BF16 per GPU",
                         peak_fp8_tflops=_GB200 + ": 5,000 dense FP8 per GPU", mxfp8=_MX,
                         memory_bandwidth_gb_per_s=_GB200 + ": 8,000 GB/s per GPU",
                         device_memory_bytes="186 GB per GPU (GB200 NVL72 datasheet) less the B200's 1.65 GiB "
                                             "between datasheet GB and what CUDA reports: 184.35 GiB",
                         devices_per_node="GB200 NVL72: 72 GPUs in one NVLink domain, modelled as one node",
                         intra_node_bandwidth_gb_per_s=_NVLINK5 + ", across all 72 GPUs (NVLink switch trays)",
                         inter_node_bandwidth_gb_per_s=_CX7 + " (between NVL72 racks)", inter_node_latency_us=_CX7,
                         overlap_compute_loss=b_why),
    )
    return {str(c["name"]): c for c in (h200, b200, gb200)}
