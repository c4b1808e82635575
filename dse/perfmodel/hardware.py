"""GPU generations: dense tensor-core peaks, HBM, NVLink and scale-out bandwidth. One table, cited.

Figures are the vendors' datasheet values for dense math (no 2:4 sparsity), per GPU:
NVIDIA A100 datasheet (SXM4 80 GB), H100 datasheet (SXM5), H200 datasheet (SXM), DGX B200 and
GB200 NVL72 / GB300 NVL72 product pages, as summarised in ``shared/reference/README.md``. NVLink
bandwidth is the total (both directions) per GPU; a collective moves data one way per link, so the
model uses half of it. Memory capacities are the datasheet figures read as GiB (HBM stacks come in
binary sizes; the driver shows e.g. 81,559 MiB on an "80 GB" H100); the model's reserve covers the
CUDA context and library workspaces.

Host link (activation offloading): nominal bandwidth per GPU and direction between the GPU and host memory.
HGX A100: PCIe Gen4 x16, 32 GB/s; HGX H100 / H200 / B200: PCIe Gen5 x16, 64 GB/s (PCI-SIG: 32 GT/s per
lane); GB200 / GB300: NVLink-C2C, 900 GB/s both directions per Grace CPU (NVIDIA GB200 NVL72 and Grace
Hopper product pages), i.e. 450 GB/s each way, shared by the two GPUs of a Grace: 225 GB/s per GPU.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GpuSpec:
    """One GPU generation. Peaks in TFLOP/s (dense), bandwidths in GB/s, scale-out in Gb/s per GPU."""

    name: str
    arch: str  # ampere, hopper, blackwell: GEMM efficiencies are fitted per architecture
    bf16_tflops: float
    fp8_tflops: float | None  # None: no FP8 tensor cores (the model then runs FP8 requests at BF16 speed)
    fp4_tflops: float | None
    memory_gib: float
    hbm_gbps: float  # HBM bandwidth, GB/s
    nvlink_gbps: float  # NVLink bandwidth per GPU, both directions together, GB/s
    nvlink_domain: int  # GPUs that share one NVLink domain (default for a system file)
    gpus_per_node: int  # default for a system file
    scaleout_gbps: float  # scale-out NIC bandwidth per GPU, Gb/s (default for a system file)
    host_link_gbps: float = 64.0  # GPU <-> host memory per GPU and direction, GB/s (PCIe / NVLink-C2C)

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for GEMMs in ``precision`` (bf16, fp8, fp4); falls back to the next wider format."""
        if precision == "fp4" and self.fp4_tflops:
            return self.fp4_tflops
        if precision in ("fp8", "fp4") and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops


HARDWARE: dict[str, GpuSpec] = {g.name: g for g in (
    #        name     arch         bf16    fp8     fp4      mem   HBM GB/s  NVLink  domain gpn  NIC Gb/s  host GB/s
    GpuSpec("a100", "ampere", 312.0, None, None, 80.0, 2039.0, 600.0, 8, 8, 200.0, 32.0),
    GpuSpec("h100", "hopper", 989.0, 1979.0, None, 80.0, 3350.0, 900.0, 8, 8, 400.0, 64.0),
    GpuSpec("h200", "hopper", 989.0, 1979.0, None, 141.0, 4800.0, 900.0, 8, 8, 400.0, 64.0),
    GpuSpec("b200", "blackwell", 2250.0, 4500.0, 9000.0, 180.0, 8000.0, 1800.0, 8, 8, 400.0, 64.0),
    GpuSpec("gb200", "blackwell", 2500.0, 5000.0, 10000.0, 186.0, 8000.0, 1800.0, 72, 4, 400.0, 225.0),
    GpuSpec("gb300", "blackwell", 2500.0, 5000.0, 15000.0, 279.0, 8000.0, 1800.0, 72, 4, 800.0, 225.0),
)}
