"""GPU generations: the one table of GPU facts. Peaks, memory, links, and the capabilities rules and
spellings derive from (FP8, MXFP8, SM100+, userbuffer family, CUDA connections). Adding a GPU is one row
here (plus its system file in ``conf/systems``); every rule, default and help text reads it.

Plain data at the bottom of the controller's layers (the space file validates GPU names against it; the
performance model reads its figures).

Figures are the vendors' datasheet values for dense math (no 2:4 sparsity), per GPU: NVIDIA A100 datasheet
(SXM4 80 GB), H100 datasheet (SXM5), H200 datasheet (SXM), DGX B200 and GB200 NVL72 / GB300 NVL72 product
pages, as summarised in ``shared/reference/README.md``, and the HGX platform page for HGX B300 (halving its
2:4-sparse BF16/FP8 figures; where it quotes none, the comment at B300's row says what was taken). NVLink
bandwidth is the total (both directions) per GPU; a collective moves data one way per link, so the model uses
half of it. Memory capacities are the datasheet figures read as GiB (HBM stacks come in binary sizes; the
driver shows e.g. 81,559 MiB on an "80 GB" H100); the model's reserve covers the CUDA context and library
workspaces.

Host link (activation offloading): nominal bandwidth per GPU and direction between the GPU and host memory.
HGX A100: PCIe Gen4 x16, 32 GB/s; HGX H100 / H200 / B200: PCIe Gen5 x16, 64 GB/s (PCI-SIG: 32 GT/s per lane),
and HGX B300 the same (its GPUs have PCIe Gen6, its x86 hosts Gen5: an assumption); GB200 / GB300:
NVLink-C2C, 900 GB/s both directions per Grace CPU (NVIDIA GB200 NVL72 and Grace Hopper product pages), i.e.
450 GB/s each way, shared by the two GPUs of a Grace: 225 GB/s per GPU.

Streaming multiprocessors (the GEMMs' waves, ``dse.perfmodel.model.wave_utilisation``): A100 108 and H100 SXM5
132 (NVIDIA's A100 and H100 architecture whitepapers; H200 is the same chip as H100), B200 148 (two dies of 74; the
count B200's CUDA device properties report, which public CUTLASS and CuTe kernels for B200 hard-code), GB200's
Blackwell GPUs the same, Blackwell Ultra (B300, GB300) 160 (NVIDIA's Blackwell Ultra description at Hot Chips
2025).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dse.recipes.mbridge import userbuffers as mbridge_userbuffers
from dse.recipes.nemo2 import userbuffers


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
    # NeMo's tuned userbuffer configs come per family: NVIDIA's performance scripts use the B200 configs on
    # GB200/GB300, and H200 is an H100 with more memory (same SMs, same NVLink). None: no TP overlap configs.
    userbuffer_family: str | None = None
    # exponentials per second of the special function units (MUFU.EX2), tera (10^12) per s: flash attention's
    # softmax runs on them, beside the tensor cores; None where no figure is published (the model then folds
    # the softmax into the attention efficiency, as for Hopper and Ampere)
    sfu_exp_tera_per_s: float | None = None
    # Blackwell Ultra (GB300): NVIDIA quotes the same dense BF16 / FP8 peaks as GB200, but its power budget is
    # reported at up to 1.4 kW per GPU against GB200's 1.2 kW (trade press, not the pages cited below), so its
    # tensor cores can hold their clock under load. Its sustained rate over GB200's is a fitted parameter
    # (timing.Params.ultra_tensor_ratio, fitted with one GB300 row), not a quoted figure
    blackwell_ultra: bool = False
    # the host CPU beside each GPU: Grace (Arm Neoverse V2) on GB200 / GB300 NVL72, whose superchips pair two
    # GPUs with one Grace CPU (GB200 NVL72 product page); x86 on HGX / DGX (DGX H100: Xeon 8480C, DGX B200:
    # Xeon 8570). The model's host-time term (timing.Params.host_layer_s_grace) applies to Grace hosts
    grace_host: bool = False
    # streaming multiprocessors: a GEMM's output tiles run in waves of one per SM, so a GEMM with few tiles, or a
    # tile count just past a multiple of the SMs, leaves some idle (dse.perfmodel.model.wave_utilisation; the
    # module's docstring gives the sources); 0: unknown, no wave loss
    sms: int = 0

    @property
    def fp8(self) -> bool:
        """FP8 tensor cores (Hopper and newer)."""
        return self.fp8_tflops is not None

    @property
    def sm100_or_newer(self) -> bool:
        """Blackwell or newer: PerfEnvPlugin's ``gpu_sm100_or_newer``."""
        return self.arch == "blackwell"

    @property
    def mxfp8(self) -> bool:
        """MXFP8 / block-scaled FP8 in the tensor cores (Blackwell)."""
        return self.sm100_or_newer

    @property
    def nvfp4(self) -> bool:
        """NVFP4 (E2M1 with 16-element E4M3 block scales) in the tensor cores: Blackwell (SM 10.0+, Transformer
        Engine's NVFP4BlockScaling recipe, "Supported devices: Blackwell and later") with a quoted dense FP4 peak."""
        return self.sm100_or_newer and self.fp4_tflops is not None

    @property
    def cuda_device_max_connections(self) -> int:
        """What PerfEnvPlugin sets when tp or cp > 1: 32 on SM100+, 1 on Hopper and older (program order)."""
        return 32 if self.sm100_or_newer else 1

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for GEMMs in ``precision`` (bf16, fp8, fp4 or nvfp4); falls back to the next wider format."""
        if precision in ("fp4", "nvfp4") and self.fp4_tflops:
            return self.fp4_tflops
        if precision in ("fp8", "fp4", "nvfp4") and self.fp8_tflops:
            return self.fp8_tflops
        return self.bf16_tflops


HARDWARE: dict[str, GpuSpec] = {
    g.name: g
    for g in (
        #        name     arch         bf16    fp8     fp4      mem   HBM GB/s  NVLink  domain gpn  NIC Gb/s  host GB/s  UB
        GpuSpec("a100", "ampere", 312.0, None, None, 80.0, 2039.0, 600.0, 8, 8, 200.0, 32.0, None, sms=108),
        GpuSpec("h100", "hopper", 989.0, 1979.0, None, 80.0, 3350.0, 900.0, 8, 8, 400.0, 64.0, "h100", sms=132),
        GpuSpec("h200", "hopper", 989.0, 1979.0, None, 141.0, 4800.0, 900.0, 8, 8, 400.0, 64.0, "h100", sms=132),
        GpuSpec(
            "b200", "blackwell", 2250.0, 4500.0, 9000.0, 180.0, 8000.0, 1800.0, 8, 8, 400.0, 64.0, "b200", 5.0, sms=148
        ),
        # HGX B300 (Blackwell Ultra, x86 host), per GPU, from NVIDIA's HGX platform page for an 8-GPU HGX B300:
        # FP16/BF16 36 PF and FP8 72 PF with 2:4 sparsity, so 2.25 and 4.5 PF dense (as B200: the HGX part runs at
        # a lower power than GB300's, and NVIDIA quotes B200's peaks for it), dense FP4 108 PF (13.5 PF per GPU),
        # up to 2.3 TB HBM3E (288 GB per GPU, read as 279 GiB as for GB300: the same stacks), 14.4 TB/s NVLink
        # (1.8 TB/s per GPU) and 1.6 TB/s networking in both directions (8 ConnectX-8 at 800 Gb/s). Not on that
        # page, so taken from the Blackwell Ultra chip GB300 shares: 8 TB/s HBM bandwidth and the doubled special
        # function units (NVIDIA blogs cited for GB300 below). Host link: the GPU has PCIe Gen6, but the x86 hosts
        # (DGX B300: Intel Xeon 6) are Gen5, so 64 GB/s each way as on B200 (an assumption: no published figure).
        # blackwell_ultra stays False: GB300's sustained rate over its quoted peaks is fitted from GB300 rows at
        # GB300's power; no published B300 row says whether the HGX part holds it too, so B300 runs at its quotes.
        GpuSpec(
            "b300",
            "blackwell",
            2250.0,
            4500.0,
            13500.0,
            279.0,
            8000.0,
            1800.0,
            8,
            8,
            800.0,
            64.0,
            "b200",
            10.7,
            sms=160,
        ),
        GpuSpec(
            "gb200",
            "blackwell",
            2500.0,
            5000.0,
            10000.0,
            186.0,
            8000.0,
            1800.0,
            72,
            4,
            400.0,
            225.0,
            "b200",
            5.0,
            grace_host=True,
            sms=148,
        ),
        # GB300 (Blackwell Ultra), per GPU: dense BF16 2.5 and FP8 5 PFLOP/s, as GB200 (GB300 NVL72 product page:
        # 180 PF dense BF16 and 360 PF dense FP8 for 72 GPUs; Blackwell Ultra raises dense NVFP4 to 15 PF, not FP8:
        # NVIDIA technical blog "Inside NVIDIA Blackwell Ultra: The Chip Powering the AI Factory Era", 2025);
        # 288 GB HBM3E in 8 stacks at 8 TB/s (same blog), exposed as 279 GiB (the GB200 ratio, 186 of 192);
        # 800 Gb/s ConnectX-8 per GPU (GB300 NVL72 product page); special function units doubled for softmax
        # (NVIDIA technical blog "Making Softmax More Efficient with NVIDIA Blackwell Ultra", 2026): 10.7 vs 5
        # tera-exponentials/s (per-GPU table of verda.com/blog/gb300-nvl72-architecture, B200 and GB200 at 5).
        GpuSpec(
            "gb300",
            "blackwell",
            2500.0,
            5000.0,
            15000.0,
            279.0,
            8000.0,
            1800.0,
            72,
            4,
            800.0,
            225.0,
            "b200",
            10.7,
            blackwell_ultra=True,
            grace_host=True,
            sms=160,
        ),
    )
}
GPU_NAMES: tuple[str, ...] = tuple(HARDWARE)


def gpu_from_device_name(name: str) -> str | None:
    """dse's GPU name for ``name``: a name of :data:`HARDWARE` as it is, or the one a device name contains, as
    torch and nvidia-smi print them (``NVIDIA H100 80GB HBM3`` -> ``h100``, ``NVIDIA GB200`` -> ``gb200``); None
    for a device of no row. The longest match wins, so ``gb300`` is not read as ``b300``."""
    low = name.strip().lower()
    if low in HARDWARE:
        return low
    hits = [key for key in HARDWARE if key in low]
    return max(hits, key=len) if hits else None


def gpus_where(capability: str) -> tuple[str, ...]:
    """The GPU names with a capability (a boolean attribute of :class:`GpuSpec`), in table order."""
    return tuple(n for n, g in HARDWARE.items() if getattr(g, capability))


# Each payload's own userbuffer tables: NeMo 2's (the simulated trainer takes NeMo 2's, as it takes its spelling),
# Megatron-Bridge's; the megatron-core payload (recipes.mcore) has none (it runs without Transformer Engine's
# userbuffers and refuses tp_comm_overlap). A payload name not listed (a published stack's) reads NeMo 2's.
UB_LOOKUPS: dict[str, Callable[[str | None, str, int, int], str | None] | None] = {
    "nemo2": userbuffers.lookup,
    "sim": userbuffers.lookup,
    "mbridge": mbridge_userbuffers.lookup,
    "mcore": None,
}


def userbuffer_config(gpu: str, precision: str, hidden_size: int, tp: int, payload: str = "nemo2") -> str | None:
    """The userbuffer config ``payload`` loads for (GPU, precision, width, tp) through the GPU's family, where
    NVIDIA's scripts for that payload run TP overlap with one; None: none. Every FP8 recipe loads the fp8 config;
    other precisions have none (NVIDIA's scripts turn TP overlap off for NVFP4)."""
    spec = HARDWARE.get(gpu)
    lookup = UB_LOOKUPS.get(payload, userbuffers.lookup)
    if lookup is None or spec is None:
        return None
    return lookup(spec.userbuffer_family, precision, hidden_size, tp)
