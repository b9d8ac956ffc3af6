"""Each declared instance sized against its GPUs (issue 34): the inventory's values read as vLLM reads them, the
GPU's memory per variant from data/compat/gpu_memory.csv, and the verdicts preflight and `gpufleet plan` give."""

from __future__ import annotations

from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.plugin_utils import gpu_memory, instance_capacity
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.instance_capacity import (
    InstanceError,
    check_instance,
    cudagraph_profiled,
    length_of,
)
from gpufleet import PROJECT_ROOT

KB = PROJECT_ROOT / "data" / "compat"
SHAPES = PROJECT_ROOT / "inventories" / "example-models"
MODELS = [
    {"name": "qwen2.5-72b", "shape": str(SHAPES / "qwen2.5-72b")},
    {"name": "qwen2.5-7b", "shape": str(SHAPES / "qwen2.5-7b")},
    {"name": "tiny-qwen2", "shape": str(PROJECT_ROOT / "lab" / "models" / "tiny-qwen2")},
]
ROWS = gpu_memory.read_rows(str(KB))
H100 = gpu_memory.memory_of(ROWS, "H100", "H100")


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (None, None),
        ("", None),
        ("auto", None),
        (-1, None),
        (4096, 4096),
        ("4096", 4096),
        ("32k", 32_000),
        ("32K", 32_768),
        ("1m", 1_000_000),
        ("1M", 1_048_576),
    ],
)
def test_lengths_are_read_as_vllm_reads_them(value: object, expected: int | None) -> None:
    assert length_of(value, "max_model_len") == expected


def test_a_length_vllm_would_not_read_is_named() -> None:
    with pytest.raises(InstanceError, match="max_model_len '32 k' is not a number"):
        length_of("32 k", "max_model_len")


def test_the_cuda_graph_estimate_counts_where_vllm_subtracts_it() -> None:
    assert [cudagraph_profiled(v) for v in ("0.19.1", "0.21.0", "0.25.2", "0.26.0")] == [False, True, True, False]


def test_the_gpu_variant_is_the_declared_one_or_the_first_row_named_as_assumed() -> None:
    assert (H100.variant, H100.assumed, H100.cuda_total_bytes) == ("SXM5 80GB HBM3", True, 85_045_477_376)
    nvl = gpu_memory.memory_of(ROWS, "H100", "NVIDIA H100 NVL")
    assert (nvl.variant, nvl.assumed) == ("NVL 94GB HBM3", False)
    a100 = gpu_memory.memory_of(ROWS, "A100", "A100 80GB")
    assert "80GB" in a100.variant and not a100.assumed
    with pytest.raises(gpu_memory.GpuMemoryError, match="no memory figure .* data/compat/gpu_memory.csv"):
        gpu_memory.memory_of(ROWS, "GTX 480", "GTX 480")


def instance(**keys: object) -> dict[str, object]:
    return {"name": "main", "model": "/var/lib/gpufleet/models/qwen2.5-72b", "gpus": list(range(8)), **keys}


def test_qwen2_5_72b_at_tp_8_on_h100_fits_with_its_weights_and_kv_per_token() -> None:
    verdict = check_instance(instance(tensor_parallel_size=8), MODELS, [H100], "0.19.1")
    assert verdict.status == "fits", verdict.message
    # 145,412,407,296 bytes of weights / 8; 80 layers x 2 (K, V) x 1 KV head per GPU (8 / 8) x 128 x 2 bytes.
    assert verdict.figures["weights_bytes_per_gpu"] == 18_176_550_912
    assert verdict.figures["kv_bytes_per_token"] == {"full_attention": 80 * 2 * 1 * 128 * 2}


def test_at_tp_2_the_smallest_fixes_are_named_and_auto_takes_the_largest_length() -> None:
    refused = check_instance(instance(tensor_parallel_size=2), MODELS, [H100], "0.19.1")
    assert refused.status == "does_not_fit"
    assert "one request of max_model_len 32,768 tokens needs" in refused.message
    settings = [fix["setting"] for fix in refused.fixes]
    assert settings[-1] == "tensor_parallel_size" and "max_model_len" in settings
    largest = next(fix["value"] for fix in refused.fixes if fix["setting"] == "max_model_len")
    auto = check_instance(instance(tensor_parallel_size=2, max_model_len="auto"), MODELS, [H100], "0.19.1")
    assert auto.status == "fits" and auto.figures["max_model_len"] == largest


def test_what_the_planner_cannot_size_is_refused_naming_it_and_an_opt_out_is_said() -> None:
    hub = check_instance(instance(model="Qwen/Qwen2.5-72B-Instruct"), MODELS, [H100], "0.26.0")
    assert hub.status == "refused" and "not a model staged by model_store" in hub.message
    unknown_gpu = check_instance(
        instance(), MODELS, [], "0.26.0", gpu_problem="GPU '9.0' is declared by compute capability"
    )
    assert unknown_gpu.status == "refused" and "compute capability" in unknown_gpu.message
    skipped = check_instance(instance(model="Qwen/Qwen2.5-72B-Instruct", capacity_check=False), MODELS, [H100], "")
    assert (skipped.status, skipped.message) == (
        "not_checked",
        "not checked: capacity_check is false for this instance",
    )


def test_a_cpu_instance_gets_vllm_s_cpu_kv_cache_of_its_fixed_space(tmp_path: Path) -> None:
    """The lab's tiny Qwen2: 2 layers x 2 x 1 KV head x 64 x 2 bytes = 512 bytes a token; 1 GiB holds 2,097,152
    tokens, 4096 requests of its 512: the lab's vLLM logs exactly "CPU KV cache size: 2,097,152 tokens"."""
    cpu = {
        "name": "main",
        "model": "/var/lib/gpufleet/models/tiny-qwen2",
        "gpus": [0],
        "env": {"VLLM_CPU_KVCACHE_SPACE": "1"},
    }
    verdict = check_instance(cpu, MODELS, [], "0.32.0")
    assert verdict.status == "fits"
    assert verdict.figures["kv_cache_tokens"] == 2_097_152 and verdict.figures["max_concurrency"] == 4096.0
    assert "CPU KV cache size: 2,097,152 tokens" in verdict.message
    assert (
        instance_capacity.check_instances([{"name": "x", "model": "/m/tiny-qwen2"}], {"gpus": []}, MODELS, [], "")[
            0
        ].status
        == "not_checked"
    )


H200_LOG = (PROJECT_ROOT / "tests" / "fixtures" / "h200-real" / "vllm_serve.log").read_text()


def test_what_vllm_logged_at_start_is_read_from_the_h200_capture() -> None:
    assert instance_capacity.logged_kv_cache(H200_LOG) == (32_831_168, 4096, 8015.42)
    assert instance_capacity.logged_kv_cache("no engine start here") is None


@pytest.mark.parametrize(("predicted", "warned"), [(32_831_168, False), (34_000_000, False), (36_500_000, True)])
def test_a_prediction_off_vllm_s_figure_by_more_than_the_tolerance_is_warned(predicted: int, warned: bool) -> None:
    verdict = instance_capacity.InstanceCapacity("gpu0", "/m", "fits", "", {"kv_cache_tokens": predicted})
    compared = instance_capacity.compare_with_log(verdict, H200_LOG, 0.05)
    assert (compared["predicted"], compared["logged"]) == (predicted, 32_831_168)
    assert bool(compared["warning"]) is warned
    if warned:
        assert (
            "vLLM allocated a KV cache of 32,831,168 tokens, the plan predicted 36,500,000 (+11.2%"
            in compared["warning"]
        )


def test_a_declared_kv_cache_size_is_what_the_plan_sizes() -> None:
    """--kv-cache-memory (the flag vLLM 0.26's log recommends): 8 GiB at TP 8 holds 8 GiB / 40,960 bytes a token
    (Qwen2.5-72B: 80 layers x 2 x 1 KV head x 128 x 2 bytes), 209,715 tokens, in whole blocks of 16: 209,712."""
    fits = check_instance(
        instance(tensor_parallel_size=8, extra_args=["--kv-cache-memory", "8G"]), MODELS, [H100], "0.26.0"
    )
    assert fits.status == "fits", fits.message
    assert fits.figures["kv_cache_tokens"] == 209_712 and "--kv-cache-memory 8.00 GiB" in fits.message
    too_big = check_instance(
        instance(tensor_parallel_size=8, extra_args=["--kv-cache-memory=70G"]), MODELS, [H100], "0.26.0"
    )
    assert too_big.status == "does_not_fit" and "exceed the GPU's 79.20 GiB" in too_big.message
    too_small = check_instance(
        instance(tensor_parallel_size=8, extra_args=["--kv-cache-memory-bytes", "1000000"]), MODELS, [H100], "0.19.1"
    )
    assert (
        too_small.status == "does_not_fit" and "one request of max_model_len 32,768 tokens needs" in too_small.message
    )
