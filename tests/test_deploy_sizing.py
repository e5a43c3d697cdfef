"""Sizes and time budgets (trtspec/deploy/sizing.py, issue #21): properties over every shipped config,
the refusals `trtspec check` makes from them, and the GPU table against plan.GPUS."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import CONFIGS

from trtspec.check import run_check
from trtspec.checkpoints.memory import RUNTIME_RESERVE_GB, parameter_count
from trtspec.config import DeploymentConfig, load_config, validate_config
from trtspec.deploy import sizing
from trtspec.deploy.topology import topology
from trtspec.errors import ConfigError

ALL_CONFIGS = sorted(p.name for p in CONFIGS.glob("*.yaml"))
H200_70B = "llama-3.3-70b-1b-draft-h200.yaml"
R1_8GPU = "deepseek-r1-mtp-8gpu.yaml"
R1_2NODE = "deepseek-r1-mtp-2x8-h100.yaml"
LLAMA_405B = "llama-3.1-405b-3b-draft-tp4.yaml"
CPU = "tiny-draft-target.yaml"


def variant(name: str, **changes: dict) -> DeploymentConfig:
    """A shipped config with some sections changed (a None value removes the key)."""
    data = yaml.safe_load((CONFIGS / name).read_text())
    for section, values in changes.items():
        merged = {**data.get(section, {}), **values}
        data[section] = {k: v for k, v in merged.items() if v is not None}
    return validate_config(data, source=CONFIGS / name)


def gib(quantity: str) -> float:
    return sizing.quantity_bytes(quantity) / 2**30


def required_gb(cfg: DeploymentConfig) -> float:
    weights = sizing.weights_gb_per_gpu(cfg)
    assert weights is not None
    return max(weights + RUNTIME_RESERVE_GB, cfg.build.gpu_memory_gb or 0.0)


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_shm_fits_the_memory_limit_of_every_pod(name):
    cfg = load_config(CONFIGS / name)
    shm = gib(sizing.shm_size(cfg))
    for stage in ("serve", "build"):
        assert 0 < shm <= gib(sizing.memory_limit(cfg, stage)) / 4
    assert shm <= (1 if topology(cfg).cpu_only else 16)


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_memory_is_never_below_nvidias_chart_and_holds_the_nodes_weights(name):
    cfg = load_config(CONFIGS / name)
    topo = topology(cfg)
    serve = gib(sizing.memory_limit(cfg, "serve"))
    floor = 4 if topo.cpu_only else 8 * max(4, topo.gpus_per_pod)
    assert serve >= floor and gib(sizing.memory_limit(cfg, "build")) >= floor
    gpus = max(1, topo.gpus_per_pod)
    node_weights = sizing.weights_gb_per_gpu(cfg) * gpus * 1e9 / 2**30
    assert serve >= node_weights + gib(sizing.shm_size(cfg))  # the weights and /dev/shm both fit the limit


def test_host_memory_follows_the_checkpoint_and_the_stage():
    """The issue's cases: eight DeepSeek ranks got 64Gi, quantizing 405B BF16 over 4 GPUs got 32Gi."""
    r1 = load_config(CONFIGS / R1_8GPU)
    assert gib(sizing.memory_limit(r1, "serve")) >= sizing.weights_gb_per_gpu(r1) * 8 * 1e9 / 2**30
    big = load_config(CONFIGS / LLAMA_405B)  # one pod converts the whole BF16 checkpoint
    assert gib(sizing.memory_limit(big, "build")) >= sizing.checkpoint_bytes(big) / 2**30
    assert gib(sizing.memory_limit(big, "build")) > gib(sizing.memory_limit(big, "serve"))  # BF16 in, FP8 out
    two_node = load_config(CONFIGS / R1_2NODE)  # its Job only packages: no load, the chart's floor
    assert gib(sizing.memory_limit(two_node, "build")) == 8 * 8
    assert gib(sizing.memory_limit(two_node, "serve")) < gib(sizing.memory_limit(r1, "serve"))  # half the weights


def test_explicit_memory_and_shm_win_and_shm_beyond_the_limit_is_refused_in_one_line():
    cfg = variant(H200_70B, deploy={"memory": "10Gi"})
    assert sizing.memory_limit(cfg, "serve") == sizing.memory_limit(cfg, "build") == "10Gi"
    assert sizing.shm_size(cfg) == "2560Mi"  # a quarter of the explicit limit
    assert sizing.shm_size(variant(H200_70B, deploy={"memory": "10Gi", "shm_size": "10Gi"})) == "10Gi"
    too_big = variant(CPU, deploy={"shm_size": "16Gi"})  # the old default in the CPU variant's 4Gi pod
    with pytest.raises(ConfigError, match=r"deploy\.shm_size: 16Gi exceeds the pod memory limit 4Gi") as err:
        sizing.shm_size(too_big)
    assert "\n" not in str(err.value) and str(err.value).startswith(str(CONFIGS / CPU))
    shm = [f for f in run_check(too_big).findings if f.code == "shm-size"]
    assert [f.severity for f in shm] == ["error"]


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_budgets_are_positive_and_download_only_hub_ids(name):
    cfg = load_config(CONFIGS / name)
    b = sizing.budgets(cfg)
    assert b.build_s > 0 and b.load_s > 0 and b.download_s >= 0
    hub = any(cfg.checkpoint_path(s) is None for s in (cfg.target, cfg.draft) if s is not None)
    assert (b.download_s > 0) == hub
    if topology(cfg).cpu_only:  # the tiny configs start in minutes, not the GPU budgets
        assert b.load_s <= 300 and b.build_s <= 600


def test_load_and_download_budgets_grow_with_the_model():
    tiny, mid, big = (load_config(CONFIGS / n) for n in (CPU, H200_70B, LLAMA_405B))
    assert sizing.budgets(tiny).load_s < sizing.budgets(mid).load_s < sizing.budgets(big).load_s
    assert sizing.budgets(mid).download_s < sizing.budgets(big).download_s
    assert sizing.budgets(mid).build_s < sizing.budgets(big).build_s
    small, large = (variant(H200_70B, deploy={"weights_gb": gb}) for gb in (20.0, 200.0))
    for phase in ("download_s", "build_s", "load_s"):
        assert getattr(sizing.budgets(small), phase) < getattr(sizing.budgets(large), phase)


def test_the_two_node_leader_gets_time_for_its_download_and_load():
    """The issue: ~700 GB fetched within a 30-minute probe; the wait for the build outlasting the probe."""
    b = sizing.budgets(load_config(CONFIGS / R1_2NODE))
    size = sizing.checkpoint_bytes(load_config(CONFIGS / R1_2NODE))
    assert size > 600e9
    assert b.download_s >= size / (sizing.HUB_DOWNLOAD_MBPS * 1e6)
    assert b.load_s >= size / (sizing.VOLUME_READ_MBPS * 1e6)


def test_unknown_hub_ids_have_no_size_unless_weights_gb_says():
    cfg = variant(H200_70B, target={"checkpoint": "someone/unknown-70b"})
    assert sizing.checkpoint_bytes(cfg) is None and sizing.weights_gb_per_gpu(cfg) is None
    assert sizing.fits(cfg) is None  # nothing known to refuse on; gpu_memory_gb 141 still narrows the GPUs
    assert all(sizing.GPU_PRODUCTS[p] >= 141 for p in sizing.gpu_products(cfg))
    b = sizing.budgets(cfg)
    assert (b.download_s, b.build_s, b.load_s) == (
        sizing.UNKNOWN_DOWNLOAD_S,
        sizing.UNKNOWN_BUILD_S,
        sizing.UNKNOWN_LOAD_S,
    )
    given = variant(H200_70B, target={"checkpoint": "someone/unknown-70b"}, deploy={"weights_gb": 140.0})
    assert sizing.checkpoint_bytes(given) == 140e9
    assert sizing.weights_gb_per_gpu(given) == pytest.approx(70.0)  # BF16 as published, served in FP8


@pytest.mark.parametrize("name", ALL_CONFIGS)
def test_gpu_products_are_exactly_the_known_gpus_that_hold_the_weights(name):
    cfg = load_config(CONFIGS / name)
    products = sizing.gpu_products(cfg)
    assert sizing.fits(cfg) is None  # every shipped config fits the GPUs it may land on
    if topology(cfg).cpu_only:
        assert products == []
    elif cfg.deploy.gpu_product:
        assert products == [cfg.deploy.gpu_product]
        assert sizing.GPU_PRODUCTS[cfg.deploy.gpu_product] >= required_gb(cfg)
    else:
        need = required_gb(cfg)
        holding = {p for p, gb in sizing.GPU_PRODUCTS.items() if gb >= need}
        if cfg.build.backend == "tensorrt":  # engines load only on the architecture they were built for
            smallest = min(holding, key=lambda p: (sizing.GPU_PRODUCTS[p], p))
            holding = {p for p in holding if sizing.architecture(p) == sizing.architecture(smallest)}
        assert products and set(products) == holding


def test_the_h200_config_excludes_80gb_gpus_when_its_weights_or_plan_do_not_fit_them():
    cfg = load_config(CONFIGS / H200_70B)
    eighty = {p for p, gb in sizing.GPU_PRODUCTS.items() if gb == 80}
    assert eighty and required_gb(cfg) > 80
    assert not eighty & set(sizing.gpu_products(cfg))  # KV caps sized for 141 GB: 80 GB GPUs are out
    unplanned = variant(H200_70B, build={"gpu_memory_gb": None})  # the weights alone decide
    fits_80 = sizing.weights_gb_per_gpu(unplanned) + RUNTIME_RESERVE_GB <= 80
    hopper = {p for p in eighty if sizing.architecture(p) == "hopper"}  # the engines' architecture
    assert (hopper <= set(sizing.gpu_products(unplanned))) == fits_80
    bf16 = variant(H200_70B, target={"quantization": "none"}, build={"gpu_memory_gb": None})
    need = sizing.weights_gb_per_gpu(bf16) + RUNTIME_RESERVE_GB
    assert need > 141  # 70B in BF16 does not fit one H200
    holding = [p for p, gb in sizing.GPU_PRODUCTS.items() if gb >= need]
    assert holding and sizing.gpu_products(bf16) == [p for p in holding if sizing.architecture(p) == "blackwell"]


def test_check_refuses_weights_that_cannot_fit_the_pinned_gpu_in_one_line():
    cfg = variant(R1_8GPU, build={"gpu_memory_gb": None}, deploy={"gpu_product": "NVIDIA-H100-80GB-HBM3"})
    assert sizing.weights_gb_per_gpu(cfg) > 80  # DeepSeek-R1 over 8 GPUs: ~85 GB each
    report = run_check(cfg)
    errors = [f for f in report.findings if f.severity == "error"]
    assert not report.ok and [f.code for f in errors] == ["gpu-fit"]
    assert "NVIDIA-H100-80GB-HBM3" in errors[0].message and "\n" not in errors[0].message
    assert "deploy.gpu_product" in errors[0].message
    assert run_check(load_config(CONFIGS / R1_8GPU)).ok  # the same model on H200s is fine


def test_fits_names_each_way_a_config_cannot_fit():
    planned = variant(R1_8GPU, build={"gpu_memory_gb": 80})
    assert sizing.fits(planned).startswith("build.gpu_memory_gb 80 cannot hold")
    pinned_small = variant(H200_70B, deploy={"gpu_product": "NVIDIA-H100-NVL"})  # 94 GB < the 141 planned
    assert "less than build.gpu_memory_gb 141" in sizing.fits(pinned_small)
    huge = variant(LLAMA_405B, target={"quantization": "none"}, build={"tp": 1, "gpu_memory_gb": None})
    assert sizing.fits(huge).startswith("no known GPU holds") and sizing.gpu_products(huge) == []
    assert [f.code for f in run_check(huge).findings if f.severity == "error"] == ["gpu-fit"]


def test_check_says_it_once_when_its_memory_check_already_refused(tmp_path):
    """A local checkpoint too large for build.gpu_memory_gb: check's own memory-weights line, not a second."""
    target = tmp_path / "t"
    target.mkdir()
    known = {k: v for k, v in sizing.KNOWN_CHECKPOINTS["meta-llama/Llama-3.3-70B-Instruct"].items() if k != "published"}
    (target / "config.json").write_text(json.dumps({**known, "max_position_embeddings": 131072}))
    data = {
        "name": "local",
        "target": {"checkpoint": str(target)},
        "speculation": {"mode": "none"},
        "build": {"backend": "tensorrt", "gpu_memory_gb": 80, "max_input_len": 1024, "max_seq_len": 2048},
        "serve": {"flavour": "engine", "streaming": False},
    }
    report = run_check(validate_config(data))
    assert [f.code for f in report.findings if f.severity == "error"] == ["memory-weights"]
    cfg = validate_config(data)
    assert sizing.fits(cfg) is not None  # sizing agrees; check does not say it twice
    assert sizing.weights_gb_per_gpu(cfg) == pytest.approx(report.facts["memory"]["weights_gb_per_gpu"], abs=0.01)
    assert sizing.checkpoint_bytes(cfg) == parameter_count(known) * 2  # no weight files: BF16 per config.json


def test_embedded_checkpoints_are_sized_from_their_files():
    cfg = load_config(CONFIGS / CPU)
    files = sum(
        f.stat().st_size for s in (cfg.target, cfg.draft) for f in Path(cfg.checkpoint_path(s)).glob("*.safetensors")
    )
    assert files > 0 and sizing.checkpoint_bytes(cfg) == files


def test_read_write_many_without_a_storage_class_is_detected():
    no_class = {"storage": {"size": "300Gi"}}  # the storage section without storage_class
    hpa = variant(H200_70B, deploy={**no_class, "autoscaling": {"enabled": True}})
    assert sizing.read_write_many(hpa) and sizing.needs_storage_class(hpa)  # the HPA may add replicas elsewhere
    named = variant(H200_70B, deploy={"storage": {"size": "300Gi", "storage_class": "efs-sc"}})
    assert not sizing.needs_storage_class(named)
    single = variant(H200_70B, deploy={**no_class, "autoscaling": {"enabled": False}, "replicas": 1})
    assert not sizing.read_write_many(single) and not sizing.needs_storage_class(single)  # ReadWriteOnce
    two = variant(H200_70B, deploy={**no_class, "autoscaling": {"enabled": False}, "replicas": 2})
    assert sizing.needs_storage_class(two)
    group = variant(R1_2NODE, deploy={"storage": {"size": "1500Gi"}, "autoscaling": {"enabled": False}})
    assert topology(group).multi_node and sizing.needs_storage_class(group)  # a group spans nodes


def test_gpu_table_agrees_with_plan():
    from trtspec.plan import GPUS

    assert set(sizing.PLAN_GPU_PRODUCTS) == set(GPUS)
    for name, product in sizing.PLAN_GPU_PRODUCTS.items():
        assert sizing.GPU_PRODUCTS[product] == GPUS[name]["memory_gb"], name


@pytest.mark.parametrize(
    ("hub_id", "billions"),
    # parameter counts the checkpoints' pages publish (safetensors metadata on Hugging Face)
    [
        ("meta-llama/Llama-3.3-70B-Instruct", 70.6),
        ("meta-llama/Llama-3.1-405B-Instruct", 406),
        ("meta-llama/Llama-3.2-1B-Instruct", 1.24),
        ("meta-llama/Llama-3.2-3B-Instruct", 3.21),
        ("deepseek-ai/DeepSeek-R1", 685),  # 671B and the 14B MTP layer
    ],
)
def test_known_checkpoints_match_their_published_sizes(hub_id, billions):
    assert parameter_count(sizing.KNOWN_CHECKPOINTS[hub_id]) / 1e9 == pytest.approx(billions, rel=0.01)


def test_known_checkpoints_cover_exactly_the_shipped_hub_ids():
    used = set()
    for name in ALL_CONFIGS:
        cfg = load_config(CONFIGS / name)
        used |= {s.checkpoint for s in (cfg.target, cfg.draft) if s is not None and cfg.checkpoint_path(s) is None}
    assert used == set(sizing.KNOWN_CHECKPOINTS)
