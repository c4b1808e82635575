"""Fitting the model's physical parameters to published throughput (used by ``bench/model_accuracy.py``).

A maximum-a-posteriori fit: squared log error of tokens/s/GPU over the rows plus a Gaussian prior on each
parameter (in log space for rates, logit space for fractions), so that a parameter the rows say little
about stays at its physical prior instead of absorbing noise. The optimisers are SciPy's: Nelder-Mead
(:func:`scipy.optimize.minimize`) from the start and from a grid pass along each coordinate
(:func:`scipy.optimize.brute`). Powell's coordinate-direction search in its place (a line search from the start)
left the Grace host term at its prior on the published rows, where the loss is flat (:func:`coordinate_pass`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from scipy.optimize import brute, minimize

from dse.perfmodel.timing import DEFAULT_PARAMS, Params


@dataclass(frozen=True)
class Prior:
    """Centre and width of a parameter's prior; ``kind`` is ``log`` (a positive rate), ``log_min1`` (a ratio of at
    least 1, in log space, held at 1 below it: a busiest-over-mean ratio), ``logit`` (0..1) or ``linear`` (any real:
    an offset; the width is then in the parameter's own unit)."""

    centre: float
    width: float
    kind: str = "logit"

    def to_z(self, x: float) -> float:
        if self.kind == "linear":
            return x
        return math.log(x) if self.kind in ("log", "log_min1") else math.log(x / (1.0 - x))

    def from_z(self, z: float) -> float:
        if self.kind == "linear":
            return z
        if self.kind == "log_min1":
            return max(1.0, math.exp(z))
        return math.exp(z) if self.kind == "log" else 1.0 / (1.0 + math.exp(-min(max(z, -700.0), 700.0)))


# Centres from vendor or library measurements where there are some (comments), widths loose enough for
# the data to move them.
PRIORS: dict[str, Prior] = {
    "gemm_eff_fp8": Prior(0.65, 0.5),  # cuBLASLt FP8 GEMMs: ~1,300 of 1,979 TFLOP/s on H100 at large sizes
    "gemm_eff_fp8_blackwell": Prior(0.65, 0.5),  # cuBLASLt FP8 on B200: ~3,000 of 4,500 TFLOP/s
    # Hopper: the kernels the fitted rows' containers could run, alone: FlashAttention-2 up to 335 of 989 TFLOP/s
    # forward + backward on H100 (Dao 2023, arXiv 2307.08691), 0.34 of the peak (PyTorch's FlashAttention-2 causal,
    # head dim 128, 264-329 TFLOP/s at 4k-64k on H200 in cudnn-frontend's benchmark/benchmark_results.csv); cuDNN
    # 9.1's fused attention, which Transformer Engine prefers on Hopper, 468-520 TFLOP/s in the same table, ~0.5;
    # FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608: forward ~610-660, backward ~450-500 at 8k-16k) ~0.5. In
    # training the rate sits below the kernel alone (Transformer Engine's per-call work around it: layouts, the RNG
    # state, context parallelism's per-step calls): every fit with a long-context Hopper row puts it at 0.36-0.40.
    # Centred at the low end, FlashAttention-2's: centred at 0.5, the fold of bench/model_sources.py without NeMo's
    # long-sequence rows (the only Hopper rows where attention dominates) ended at 0.53 and over-predicted them by 23%
    "attn_eff": Prior(0.34, 0.5),
    # Blackwell: cuDNN's fused attention, which Transformer Engine 2.x selects on compute capability 9.0 and newer
    # whenever FlashAttention could also run (NVIDIA/TransformerEngine v2.3, get_attention_backend in
    # transformer_engine/pytorch/attention/dot_product_attention/utils.py: "Disabling FlashAttention to give
    # FusedAttention preference on Hopper+"; attention.py in v2.1), alone on one B200 (cuDNN 9.10.2, NGC PyTorch 25.06,
    # Llama 3.1 405B's heads: 128 query, 8 KV, head dim 128, causal; NVIDIA/cudnn-frontend
    # benchmark/sdpa_benchmark_training/artifacts/sdpa_bf16_benchmark_results_NVIDIA_B200.csv): forward 1,332-1,419 and
    # backward 1,048-1,109 TFLOP/s at 16k-128k, forward + backward 1,120-1,183 (0.50-0.53 of the 2,250 peak). The model
    # prices the softmax's exponentials apart, in series, at the SFUs' 5 tera/s
    # (dse.perfmodel.model.flash_attention_time: 0.88 of the peak's time per causal FLOP forward and once more
    # backward), so the same kernel times give a tensor-core share of 0.66-0.71: centred there, on the oldest cuDNN with
    # a published Blackwell figure (cuDNN 9.17 on GB200 in the same benchmark reaches 0.56-0.57 of GB200's peak at
    # 16k-32k). Before, centred on FlashAttention-3's Hopper figure (0.5) for want of a Blackwell one, the fold of
    # bench/model_sources.py without NeMo 25.04's long-sequence rows (the only Blackwell rows where attention dominates)
    # ended at 0.51 and under-predicted them by 11%
    "attn_eff_blackwell": Prior(0.69, 0.5),
    # Blackwell Ultra's sustained tensor rate over GB200's: the same quoted peaks, so centred on 1; the 1.4 vs
    # 1.2 kW power budget (1.17x) bounds it loosely (log width 0.25)
    "ultra_tensor_ratio": Prior(1.0, 0.25, "log"),
    # MXFP8 over per-tensor FP8 GEMMs: the same tensor-core peak, so centred on 1
    "mxfp8_gemm_ratio": Prior(1.0, 0.25, "log"),
    # NVFP4 GEMMs over the dense FP4 peak: no kernel benchmark in the reference set; centred on the Blackwell FP8
    # efficiency the published rows give (gemm_eff_fp8_blackwell, 0.548), as loose
    "gemm_eff_nvfp4": Prior(0.55, 0.5),
    # Grace's host time per layer (forward + backward): what TransformerEngine issue 2053's figures add up to, about
    # 100 µs of CPU per TE module call and 37 µs per PyTorch op on GB200, for a layer's four TE GEMM modules, its
    # attention and a dozen ops, forward and about twice that backward: ~3 ms; loose (log width 1), since FP8
    # scaling, TP overlap, context parallelism and the TE version add to it
    "host_layer_s_grace": Prior(0.003, 1.0, "log"),
    # a container family's software efficiency over the reference family's (dse.facts.containers): centred on 1 (no
    # change), log width 0.1, since releases of one recipe move its throughput by a few percent to ~10% (GB300 Llama
    # 3 70B: +11% from 25.11 to 26.02, Megatron-Bridge docs/performance-summary-archive.md)
    "container_eff_nemo24": Prior(1.0, 0.1, "log"),
    "container_eff_nemo25": Prior(1.0, 0.1, "log"),
    "container_eff_bridge26": Prior(1.0, 0.1, "log"),
    "container_ultra_bridge26": Prior(1.0, 0.1, "log"),
    # the 26.x containers' Grace host time per layer over 25.x's: centred on 1 (the same framework's launches), log
    # width 0.5, since a Transformer Engine release can fuse or drop whole kernels per module (fewer launches per
    # layer) as well as add hooks
    "container_host_bridge26": Prior(1.0, 0.5, "log"),
    "elementwise_scale": Prior(1.4, 0.4, "log"),  # element-wise kernels reach ~70% of HBM bandwidth
    "nvlink_eff": Prior(0.80, 0.5),  # nccl-tests all-gather bus bandwidth ~360 of 450 GB/s (H100)
    "scaleout_eff": Prior(0.80, 0.5),  # nccl-tests across nodes: ~40 of 50 GB/s per 400 Gb/s NIC
    "tp_overlap": Prior(0.80, 0.8),  # userbuffers hide most TP traffic behind GEMMs
    "cp_overlap": Prior(0.70, 0.8),
    "dp_overlap": Prior(0.80, 0.8),
}


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, *, step: float = 0.3, iters: int = 600, tol: float = 1e-7
) -> np.ndarray:
    """The best vertex of SciPy's Nelder-Mead from ``x0``: a first simplex of ``step`` along each coordinate, at
    most ``iters`` iterations, stopped when the simplex's values lie within ``tol`` (no tolerance on the points)."""
    x0 = np.asarray(x0, dtype=float)
    simplex = np.vstack([x0, x0 + step * np.eye(len(x0))])
    return minimize(
        f,
        x0,
        method="Nelder-Mead",
        options={"initial_simplex": simplex, "maxiter": iters, "xatol": np.inf, "fatol": tol},
    ).x


def coordinate_pass(loss: Callable[[np.ndarray], float], start: np.ndarray, width: np.ndarray) -> np.ndarray:
    """One pass over the coordinates in turn, each set to the best of a grid of ``start`` ± 2 ``width`` in quarter
    widths (:func:`scipy.optimize.brute`) with the others held where the pass left them: one of the two starts of
    :func:`minimise`. A term that acts only past a threshold (Params.host_layer_s_grace: a layer waits only for a
    host slower than its GPU time) leaves the loss flat around the start, where the simplex's first steps (and a
    line search from the start) would not find the slope; a grid over the prior's range does."""
    z = np.array(start, dtype=float)
    best = loss(z)
    for i in range(len(z)):

        def along(x: np.ndarray, i: int = i) -> float:
            trial = z.copy()
            trial[i] = x[0]
            return loss(trial)

        grid = (slice(start[i] - 2.0 * width[i], start[i] + 2.01 * width[i], 0.25 * width[i]),)
        x, value, _, _ = brute(along, grid, full_output=True, finish=None)
        if value < best:
            z[i], best = float(np.atleast_1d(x)[0]), value
    return z


def minimise(
    loss: Callable[[np.ndarray], float], start: np.ndarray, width: np.ndarray, restarts: int = 2
) -> np.ndarray:
    """The lower of two Nelder-Mead descents, each restarted ``restarts`` times from its own optimum (the simplex
    can stall on a face): one from ``start``, one from the end of :func:`coordinate_pass` around it."""
    ends = []
    for z in (np.array(start, dtype=float), coordinate_pass(loss, start, width)):
        for _ in range(restarts + 1):
            z = nelder_mead(loss, z)
        ends.append(z)
    return min(ends, key=loss)


def params_from_z(z: Sequence[float] | np.ndarray, names: Sequence[str], base: Params = DEFAULT_PARAMS) -> Params:
    return base.with_values(**{n: PRIORS[n].from_z(float(v)) for n, v in zip(names, z)})


def fit(
    predict_fn: Callable[[object, Params], float],
    rows: Sequence[tuple[object, float]],
    *,
    names: Sequence[str] = tuple(PRIORS),
    base: Params = DEFAULT_PARAMS,
    obs_sigma: float = 0.10,
    restarts: int = 2,
) -> Params:
    """Parameters that best predict ``rows`` (pairs of an input and its published tokens/s/GPU).

    ``predict_fn(input, params)`` returns the predicted tokens/s/GPU; ``obs_sigma`` is the scatter assumed
    for a published figure (log scale: 0.1 = 10%; runs of one recipe in different containers differ
    by that much), which weighs the data against the priors. Starts at the priors' centres (:func:`minimise`).
    """
    priors = [PRIORS[n] for n in names]
    centre = np.array([p.to_z(p.centre) for p in priors])
    width = np.array([p.width for p in priors])
    logs = [math.log(pub) for _, pub in rows]

    def loss(z: np.ndarray) -> float:
        params = params_from_z(z, names, base)
        err = 0.0
        for (x, _), lp in zip(rows, logs):
            pred = predict_fn(x, params)
            err += (math.log(pred) - lp) ** 2 if pred > 0 else 100.0
        return err / obs_sigma**2 + float(np.sum(((z - centre) / width) ** 2))

    return params_from_z(minimise(loss, centre, width, restarts), names, base)
