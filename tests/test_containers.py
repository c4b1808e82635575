"""The container in the model (dse.facts.containers, a family's efficiency), the fabric above the NVLink domain (a data-
parallel collective across the pods of an oversubscribed fabric), and ``dse predict --container``."""

from __future__ import annotations

import json

import pytest

from dse.errors import UserError
from dse.facts.containers import FAMILIES, REFERENCE, resolve, row_container
from dse.perfmodel import predict
from dse.perfmodel.model import predict_layout
from dse.perfmodel.timing import DEFAULT_PARAMS, PARAM_NAMES
from dse.perfmodel.trials import default_system, make_trial
from dse.recipes.models import RECIPES
from tests.helpers import dse, one_line_error


@pytest.mark.parametrize(
    "tag, family",
    [
        ("24.07", "nemo24"),
        ("24.03.01.framework", "nemo24"),
        ("25.02", "nemo25"),
        ("25.07", "nemo25"),
        ("25.09", "bridge25"),
        ("25.11", "bridge25"),
        ("26.02", "bridge26"),
        ("26.02.01", "bridge26"),
        ("26.06", "bridge26"),
    ],
)
def test_a_tag_resolves_to_its_family(tag, family):
    got = resolve(tag)
    assert got.family.name == family and got.note == ""


def test_a_newer_tag_maps_to_the_newest_family_and_says_so():
    got = resolve("27.03")
    assert got.family is FAMILIES[-1]
    assert "27.03" in got.note and FAMILIES[-1].name in got.note


@pytest.mark.parametrize("tag", ["latest", "26.4", "26.13", "23.11", "2604"])
def test_an_unknown_tag_is_a_user_error_listing_the_families(tag):
    with pytest.raises(UserError) as err:
        resolve(tag, field="--container")
    msg = str(err.value)
    assert msg.startswith("--container: ") and "\n" not in msg
    assert all(f.name in msg for f in FAMILIES)


def test_every_family_names_params_that_exist_and_the_reference_has_none():
    for f in FAMILIES:
        for p in (f.param, f.ultra_param, f.host_param):
            assert p is None or p in PARAM_NAMES
        assert (f.param is None) == (f.name == REFERENCE)


def test_plain_fp8_means_delayed_scaling_in_nemo24_and_current_scaling_after():
    # NeMo 24.x ships Transformer Engine 1.x, whose only FP8 recipe is delayed scaling
    assert resolve("24.07").family.fp8_per_tensor == "delayed"
    for tag in ("25.04", "25.11", "26.04"):
        assert resolve(tag).family.fp8_per_tensor == "tensorwise"


@pytest.mark.parametrize(
    "row_id, source, tag",
    [
        ("mb2602_gb300_llama3_70b", "", "26.02"),
        ("mb260401_gb200_llama3_405b", "", "26.04.01"),
        ("nemo2407_h100_gpt3_5b", "", "24.07"),
        ("x_h100", "NVIDIA-NeMo/Megatron-Bridge docs, 25.09 NeMo Container", "25.09"),
        ("x_h100", "performance_summary.html (Container NeMo 25.04, DGX-GB200)", "25.04"),
        ("meta24_h100_llama3_405b_8k", "Meta, The Llama 3 Herd of Models", None),
    ],
)
def test_a_rows_container_comes_from_its_id_or_source(row_id, source, tag):
    assert row_container(row_id, source) == tag


GB300_70B = dict(tp=1, pp=4, vp=5, mbs=1, gbs=256, precision="fp8", fsdp=False, cpu_offload_layers=0)


def _tokens(container: str | None, gpu: str = "gb300", params=DEFAULT_PARAMS) -> float:
    t = make_trial(RECIPES["llama3_70b"], gpu, 64, container=container, **GB300_70B)
    return predict(t, params=params).tokens_per_s_per_gpu


def test_the_container_family_scales_the_prediction_by_its_efficiency():
    params = DEFAULT_PARAMS.with_values(container_eff_bridge26=1.2, container_ultra_bridge26=1.0)
    ref, newer = _tokens("25.11", params=params), _tokens("26.04", params=params)
    assert newer > 1.1 * ref  # the compute speeds up by 20%; communication does not
    assert _tokens("25.09", params=params) == ref  # one family, one efficiency
    # the Blackwell Ultra factor moves GB300 and leaves GB200 alone
    ultra = DEFAULT_PARAMS.with_values(container_eff_bridge26=1.0, container_ultra_bridge26=1.2)
    assert _tokens("26.04", params=ultra) > _tokens("25.11", params=ultra)
    assert _tokens("26.04", "gb200", ultra) == _tokens("25.11", "gb200", ultra)


def test_a_family_fitted_on_one_architecture_scales_that_architecture_only():
    # NeMo 25.0x's efficiency is its Blackwell rows': on B200 it scales the rates, on H100 and A100 the family runs
    # at the reference's (25.11)
    assert resolve("25.02").family.arch == "blackwell"
    slow = DEFAULT_PARAMS.with_values(container_eff_nemo25=0.8)
    for gpu in ("h100", "a100"):
        assert _tokens("25.02", gpu, slow) == _tokens("25.11", gpu, slow)
    assert _tokens("25.02", "b200", slow) < 0.9 * _tokens("25.11", "b200", slow)


def test_every_family_arch_is_a_gpu_architecture():
    from dse.facts.hardware import HARDWARE

    archs = {g.arch for g in HARDWARE.values()}
    assert all(f.arch is None or f.arch in archs for f in FAMILIES)


GB200_70B_NVFP4 = dict(tp=1, pp=4, vp=5, mbs=1, gbs=256, precision="nvfp4", fsdp=False, cpu_offload_layers=0)


def _host_wait(container: str, params=DEFAULT_PARAMS, gpu: str = "gb200") -> float:
    t = make_trial(RECIPES["llama3_70b"], gpu, 64, container=container, payload="mbridge", **GB200_70B_NVFP4)
    return predict(t, params=params).breakdown["time.host_wait_s"]


def test_the_26x_family_scales_the_grace_host_time_and_the_reference_does_not():
    # an ungraphed GB200 Llama 3 70B NVFP4 layout whose layers wait for the Grace host
    slow = DEFAULT_PARAMS.with_values(host_layer_s_grace=0.02, container_host_bridge26=1.0)
    fast = slow.with_values(container_host_bridge26=0.5)
    assert _host_wait("26.04", slow) > 0.0
    assert _host_wait("26.04", fast) < _host_wait("26.04", slow)
    assert _host_wait("25.11", fast) == _host_wait("25.11", slow)  # the reference family keeps its host time
    assert _host_wait("26.04", fast, gpu="b200") == 0.0  # x86 hosts wait for nothing


def test_the_default_system_is_in_the_reference_family():
    assert resolve(default_system("h100").container).family.name == REFERENCE
    assert _tokens(None) == _tokens("25.11")


# ---- the fabric ---------------------------------------------------------------------------------------------------

META = dict(tp=8, pp=16, vp=8, mbs=1, gbs=2048, seq_length=8192, precision="bf16", tp_comm_overlap=True)


def _dp_seconds(**fabric) -> float:
    pred = predict_layout(RECIPES["llama3_405b"].arch, "h100", num_gpus=8192, **META, **fabric)
    return pred.breakdown["time.dp_exposed_s"]


def test_a_dp_collective_crossing_pods_is_slower_with_oversubscription():
    flat = _dp_seconds()
    pods = dict(pod_gpus=3072, rank_order="tp-cp-pp-dp")
    assert _dp_seconds(**pods, pod_oversubscription=1.0) == flat  # non-blocking between pods: nothing added
    assert _dp_seconds(**pods, pod_oversubscription=7.0) > flat
    assert _dp_seconds(**pods, pod_oversubscription=7.0) > _dp_seconds(**pods, pod_oversubscription=3.0)


def test_a_dp_group_inside_one_pod_pays_nothing():
    # Megatron's default order puts the pipeline stages outermost: each stage's DP group lies in 8192 / 16 = 512 GPUs
    assert _dp_seconds(pod_gpus=3072, pod_oversubscription=7.0) == _dp_seconds()
    # data parallelism outermost, but the pod holds the whole job
    assert _dp_seconds(pod_gpus=8192, pod_oversubscription=7.0, rank_order="tp-cp-pp-dp") == _dp_seconds()


def test_the_system_file_carries_the_fabric(tmp_path):
    from dse.rules.space import load_system

    p = tmp_path / "fabric.toml"
    p.write_text('name = "f"\ngpu = "h100"\npod_gpus = 3072\npod_oversubscription = 7.0\nrank_order = "tp-cp-pp-dp"\n')
    sysm = load_system(p)
    t = make_trial(RECIPES["llama3_405b"], "h100", 8192, system=sysm, **META)
    flat = make_trial(RECIPES["llama3_405b"], "h100", 8192, **META)
    assert predict(t).breakdown["time.dp_exposed_s"] > predict(flat).breakdown["time.dp_exposed_s"]
    p.write_text('name = "f"\ngpu = "h100"\npod_oversubscription = 0.5\n')
    with pytest.raises(UserError, match="pod_oversubscription"):
        load_system(p)


# ---- dse predict --container -------------------------------------------------------------------------------------

PREDICT = ["predict", "--model", "llama3_70b", "--gpu", "gb300", "--num-gpus", "64", "--precision", "fp8"]
PREDICT += [
    "--tp",
    "1",
    "--pp",
    "4",
    "--vp",
    "5",
    "--mbs",
    "1",
    "--gbs",
    "256",
    "--no-fsdp",
    "--cpu-offload-layers",
    "0",
]


def _predict_json(*extra: str) -> dict:
    r = dse(*PREDICT, "--json", *extra)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_predict_container_selects_the_family():
    old, new = _predict_json("--container", "25.11"), _predict_json("--container", "26.04")
    assert (old["container_family"], new["container_family"]) == ("bridge25", "bridge26")
    assert new["container"] == "26.04" and new["container_note"] == ""
    assert _predict_json()["container"] == default_system("gb300").container


def test_predict_container_newer_than_every_family_says_so():
    out = _predict_json("--container", "27.03")
    assert out["container_family"] == FAMILIES[-1].name and "newer" in out["container_note"]
    r = dse(*PREDICT, "--container", "27.03")
    assert r.exit_code == 0 and "newer than every known family" in r.output


@pytest.mark.parametrize("tag", ["latest", "23.11"])
def test_predict_unknown_container_is_one_line_listing_the_families(tag):
    one_line_error(dse(*PREDICT, "--container", tag), "--container", *(f.name for f in FAMILIES))
