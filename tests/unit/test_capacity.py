"""capacity (issue 34): vLLM's KV-cache budget predicted from a ModelShape. KV bytes per token and weights per GPU
of each fixture model worked out by hand; the fixed-space formula (vLLM's CPU backend) checked against the tokens
and concurrency vLLM 0.26.0 logged on the project's H200 (tests/fixtures/h200-real/vllm_serve.log) and against
hand arithmetic for full, sliding-window, hybrid and MLA models; the verdict on what does not fit and its fix."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.capacity import (
    CapacityError,
    InstanceSettings,
    default_batch_limits,
    fits,
    kv_bytes_per_token,
    kv_groups,
    layer_kv,
    predict,
    predict_fixed_space,
    stage_layer_counts,
    stage_weights_bytes,
    weights_bytes_per_gpu,
)
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.instance_capacity import logged_kv_cache
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.model_shape import (
    ModelShape,
    Weights,
    read_model_dir,
    shape_from_config,
)

GiB = 1 << 30
CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"
# An H100 80GB as cudaMemGetInfo (and so vLLM) sees it: "Free memory on device (78.66/79.19 GiB)" in vLLM's logs.
H100_BYTES = int(79.19 * GiB)
# The project's H200 (tests/fixtures/h200-real/torch_stack_info.json, total_memory_bytes): vLLM's "139.8 GiB".
H200_BYTES = 150_109_880_320
# The project's H100 device (tests/fixtures/h100-real/, torch's total_memory): vLLM's "79.18 GiB".
H100_DEVICE_BYTES = 85_017_493_504


def shape(name: str, weights: int | None = None) -> ModelShape:
    config: dict[str, Any] = json.loads((CONFIGS / name / "config.json").read_text())
    return shape_from_config(config, Weights(weights) if weights else None)


# --- KV bytes per token, by hand from each config ------------------------------------------------------------
# Full and sliding attention: 2 (K and V) x KV heads on the GPU x head size x dtype bytes, per layer.


def test_llama_3_1_8b_kv_per_token() -> None:
    llama = read_model_dir(str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B"))
    # 32 layers x 2 x 8 KV heads x 128 x 2 bytes (bfloat16).
    assert kv_bytes_per_token(llama) == {"full_attention": 32 * 2 * 8 * 128 * 2} == {"full_attention": 131_072}
    # TP 2 splits the 8 KV heads 4 per GPU; fp8 halves the bytes.
    assert kv_bytes_per_token(llama, tensor_parallel_size=2) == {"full_attention": 32 * 2 * 4 * 128 * 2}
    assert kv_bytes_per_token(llama, "fp8") == {"full_attention": 32 * 2 * 8 * 128 * 1}
    # Weights per GPU at TP 2: half the index's 16,060,522,496 bytes.
    assert weights_bytes_per_gpu(llama, 2) == 16_060_522_496 // 2


def test_llama_3_1_70b_kv_per_token_and_pipeline_stages() -> None:
    # The bytes of the bf16 checkpoint, worked out in test_model_shape: 2 x 70,553,706,496 parameters.
    llama = shape("meta-llama--Meta-Llama-3.1-70B", 141_107_412_992)
    # 80 layers x 2 x 8 x 128 x 2; at TP 8 one KV head per GPU.
    assert kv_bytes_per_token(llama) == {"full_attention": 80 * 2 * 8 * 128 * 2} == {"full_attention": 327_680}
    assert kv_bytes_per_token(llama, tensor_parallel_size=8) == {"full_attention": 80 * 2 * 1 * 128 * 2}
    assert weights_bytes_per_gpu(llama, 4) == 141_107_412_992 // 4
    # PP 3: 80 // 3 = 26 layers each, the 2 left over to the stages before the last (vLLM's get_pp_indices).
    assert stage_layer_counts(80, 3) == [27, 27, 26]
    # The embedding (128256 x 8192 x 2 bytes) on the first stage, the LM head on the last, the rest by layer.
    embedding = 128256 * 8192 * 2
    body = 141_107_412_992 - 2 * embedding
    assert stage_weights_bytes(llama, 1, 3) == [
        body * 27 // 80 + embedding,
        body * 27 // 80,
        body * 26 // 80 + embedding,
    ]


def test_qwen3_8b_kv_per_token() -> None:
    # 36 layers x 2 x 8 KV heads x head_dim 128 x 2 bytes.
    assert kv_bytes_per_token(shape("Qwen--Qwen3-8B")) == {"full_attention": 36 * 2 * 8 * 128 * 2}
    assert kv_bytes_per_token(shape("Qwen--Qwen3-8B"))["full_attention"] == 147_456


def test_qwen3_30b_a3b_replicates_its_4_kv_heads_at_tp_8() -> None:
    qwen = shape("Qwen--Qwen3-30B-A3B", 61_064_245_248)
    # 48 layers x 2 x 4 KV heads x 128 x 2 bytes.
    assert kv_bytes_per_token(qwen) == {"full_attention": 48 * 2 * 4 * 128 * 2} == {"full_attention": 98_304}
    # TP 8 > 4 KV heads: each GPU keeps one head (replicated), never half of one.
    assert kv_bytes_per_token(qwen, tensor_parallel_size=8) == {"full_attention": 48 * 2 * 1 * 128 * 2}
    # Weights at TP 8: an eighth of the checkpoint, plus, per layer, the k and v projections of a whole KV head
    # (2048 x 128 each, 2 bytes) where an even split would have kept half of one.
    replicated = 48 * 2 * 2048 * 128 * 2 * (1 - 4 / 8)
    assert weights_bytes_per_gpu(qwen, 8) == math.ceil(61_064_245_248 / 8) + int(replicated)


def test_qwen3_30b_a3b_fp8_caches_in_bf16_unless_told() -> None:
    qwen = shape("Qwen--Qwen3-30B-A3B-FP8")
    # fp8 weights, 'auto' KV cache in torch_dtype (bfloat16); --kv-cache-dtype fp8 halves it.
    assert kv_bytes_per_token(qwen) == {"full_attention": 48 * 2 * 4 * 128 * 2}
    assert (
        kv_bytes_per_token(qwen, "fp8_e4m3") == {"full_attention": 48 * 2 * 4 * 128 * 1} == {"full_attention": 49_152}
    )


def test_qwen2_5_7b_kv_per_token() -> None:
    qwen = shape("Qwen--Qwen2.5-7B", 15_231_233_024)
    # 28 layers x 2 x 4 KV heads x (3584 / 28 = 128) x 2 bytes; no sliding layer (use_sliding_window false).
    assert kv_bytes_per_token(qwen) == {"full_attention": 28 * 2 * 4 * 128 * 2} == {"full_attention": 57_344}
    assert weights_bytes_per_gpu(qwen, 4) == 15_231_233_024 // 4


def test_mistral_7b_kv_per_token_is_all_sliding() -> None:
    mistral = shape("mistralai--Mistral-7B-v0.1", 14_483_464_192)
    assert kv_bytes_per_token(mistral) == {"sliding_attention": 32 * 2 * 8 * 128 * 2}
    assert weights_bytes_per_gpu(mistral) == 14_483_464_192


def test_mixtral_kv_per_token() -> None:
    mixtral = read_model_dir(str(CONFIGS / "mistralai--Mixtral-8x7B-v0.1"))
    assert kv_bytes_per_token(mixtral) == {"full_attention": 32 * 2 * 8 * 128 * 2}
    # The 8 experts are split across TP with the rest: a quarter of 93,405,585,408 bytes at TP 4.
    assert weights_bytes_per_gpu(mixtral, 4) == 93_405_585_408 // 4


def test_deepseek_v3_mla_kv_per_token() -> None:
    deepseek = shape("deepseek-ai--DeepSeek-V3")
    # MLA: one latent of kv_lora_rank + qk_rope_head_dim = 512 + 64 per layer, no factor 2, x 2 bytes, 61 layers.
    assert kv_bytes_per_token(deepseek) == {"mla": 61 * (512 + 64) * 2} == {"mla": 70_272}
    # Not split by TP: every rank caches the whole latent.
    assert kv_bytes_per_token(deepseek, tensor_parallel_size=8) == {"mla": 70_272}
    assert kv_bytes_per_token(deepseek, "fp8") == {"mla": 61 * (512 + 64) * 1}


def test_gemma_2_9b_kv_per_token_per_layer_kind() -> None:
    gemma = read_model_dir(str(CONFIGS / "google--gemma-2-9b-it"))
    # 21 local and 21 global layers of 2 x 8 KV heads x head_dim 256 x 2 bytes.
    per_layer = 2 * 8 * 256 * 2
    assert kv_bytes_per_token(gemma) == {"sliding_attention": 21 * per_layer, "full_attention": 21 * per_layer}
    assert weights_bytes_per_gpu(gemma, 2) == 18_483_411_968 // 2


def test_medgemma_27b_kv_per_token_per_layer_kind() -> None:
    gemma = read_model_dir(str(CONFIGS / "google--medgemma-27b-it"))
    # 52 local layers (1024 tokens) and 10 global, each 2 x 16 KV heads x 128 x 2 bytes.
    per_layer = 2 * 16 * 128 * 2
    assert kv_bytes_per_token(gemma) == {"sliding_attention": 52 * per_layer, "full_attention": 10 * per_layer}


# --- the fixed-space formula (vLLM's CPU backend, --kv-cache-memory-bytes) --------------------------------------


def tiny_qwen2() -> ModelShape:
    """The generated 4-layer Qwen2 vLLM 0.26.0 served on the H200 (tests/fixtures/h200-real/vllm_serve.json)."""
    config = {
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "hidden_size": 1024,
        "num_attention_heads": 16,
        "num_key_value_heads": 4,
        "head_dim": 64,
        "num_hidden_layers": 4,
        "intermediate_size": 2816,
        "vocab_size": 512,
        "max_position_embeddings": 4096,
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": True,
    }
    # 45,628,416 parameters in bfloat16.
    return shape_from_config(config, Weights(45_628_416 * 2))


def test_fixed_space_reproduces_what_vllm_logged_on_the_h200() -> None:
    # vLLM 0.26.0 logged "GPU KV cache size: 32,831,168 tokens" and "Maximum concurrency for 4,096 tokens per
    # request: 8015.42x". One group of 4 layers, pages of 2 x 16 tokens x 4 KV heads x 64 x 2 bytes = 16,384:
    # 32,831,168 tokens are 2,051,948 blocks, so its KV memory held 2,051,948 x 16,384 x 4 bytes
    # (= 125.24 GiB, the "Available KV cache memory: 125.24 GiB" it logged) and at most a block's worth more.
    page = 2 * 16 * 4 * 64 * 2
    blocks = 32_831_168 // 16
    for space in (blocks * page * 4, blocks * page * 4 + page * 4 - 1):
        capacity = predict_fixed_space(tiny_qwen2(), space, max_model_len=4096)
        assert capacity.log_lines() == (
            "GPU KV cache size: 32,831,168 tokens",
            "Maximum concurrency for 4,096 tokens per request: 8015.42x",
        )
        # A request of 4,096 tokens takes 4096 / 16 = 256 blocks: 2,051,948 / 256.
        assert capacity.max_concurrency == blocks / 256


def test_predict_matches_the_h200_within_a_few_percent() -> None:
    tiny = tiny_qwen2()
    # With the overheads vLLM measured ("0.27 GiB for peak activation, 0.22 GiB for non-torch memory"; vLLM
    # 0.26.0's V2 model runner did not subtract its CUDA graphs): within 0.1% of its 32,831,168 tokens.
    measured = InstanceSettings(
        gpu_memory_bytes=H200_BYTES,
        gpu_memory_utilization=0.9,
        activation_peak_bytes=int(0.27 * GiB),
        non_torch_bytes=int(0.22 * GiB),
        cudagraph_memory_profiled=False,
    )
    prediction = predict(tiny, measured)
    assert prediction.requested_bytes == int(H200_BYTES * 0.9)  # vLLM's "125.82 GiB"
    assert abs(prediction.capacity.tokens - 32_831_168) / 32_831_168 < 0.001
    # With the planner's own estimates of the overheads: within 1%.
    estimated = predict(tiny, InstanceSettings(gpu_memory_bytes=H200_BYTES, cudagraph_memory_profiled=False))
    assert abs(estimated.capacity.tokens - 32_831_168) / 32_831_168 < 0.01
    assert abs(estimated.activation_peak_bytes - 0.27 * GiB) < 0.05 * GiB
    # vLLM's defaults on a GPU of 70 GiB or more (not an A100): 8192 batched tokens, 1024 sequences.
    assert (estimated.max_num_batched_tokens, estimated.max_num_seqs) == (8192, 1024)


def test_predict_matches_the_h100_within_a_few_percent() -> None:
    """The same model and vLLM on an H100 (tests/fixtures/h100-real/time-to-serving/cold.log): "Available KV cache
    memory: 70.69 GiB", "GPU KV cache size: 18,531,200 tokens", "Maximum concurrency for 4,096 tokens per request:
    4524.22x", having measured "0.26 GiB for peak activation, 0.22 GiB for non-torch memory"."""
    tiny = tiny_qwen2()
    page = 2 * 16 * 4 * 64 * 2
    blocks = 18_531_200 // 16
    assert predict_fixed_space(tiny, blocks * page * 4, max_model_len=4096).log_lines() == (
        "GPU KV cache size: 18,531,200 tokens",
        "Maximum concurrency for 4,096 tokens per request: 4524.22x",
    )
    measured = InstanceSettings(
        gpu_memory_bytes=H100_DEVICE_BYTES,
        gpu_memory_utilization=0.9,
        activation_peak_bytes=int(0.26 * GiB),
        non_torch_bytes=int(0.22 * GiB),
        cudagraph_memory_profiled=False,
    )
    assert abs(predict(tiny, measured).capacity.tokens - 18_531_200) / 18_531_200 < 0.001
    # With the planner's own estimates of the overheads: within 1%.
    estimated = predict(tiny, InstanceSettings(gpu_memory_bytes=H100_DEVICE_BYTES, cudagraph_memory_profiled=False))
    assert abs(estimated.capacity.tokens - 18_531_200) / 18_531_200 < 0.01


# vLLM 0.26.0 built its engine for these published configs with dummy weights on the project's H100 (issue 38,
# scripts/verify-local-kv.sh, tests/fixtures/h100-real/README.md): gpu_memory_utilization 0.9, the LLM class's
# batch default (16384 tokens, logged), max_model_len 32768 for Qwen2.5-7B and Llama 3.1's own 131072.
FULL_SIZE_ON_THE_H100 = [
    ("Qwen--Qwen2.5-7B", 32768, 15_231_233_024),  # weights: the published index's total_size
    ("meta-llama--Meta-Llama-3.1-8B", None, None),  # its index is beside the config
]


@pytest.mark.parametrize(("name", "max_model_len", "weights"), FULL_SIZE_ON_THE_H100)
def test_predict_matches_vllm_for_full_size_models_on_the_h100(
    name: str, max_model_len: int | None, weights: int | None
) -> None:
    log = (Path(__file__).resolve().parents[1] / "fixtures" / "h100-real" / "kv-cache" / f"{name}.log").read_text()
    tokens, logged_length, _ = logged_kv_cache(log)  # type: ignore[misc]
    usage = re.search(
        r"Actual usage is ([0-9.]+) GiB for weight, ([0-9.]+) GiB for peak activation, ([0-9.]+) GiB", log
    )
    assert usage and "max_num_batched_tokens=16384" in log
    model = shape(name, weights) if weights else read_model_dir(CONFIGS / name)
    settings = InstanceSettings(
        gpu_memory_bytes=H100_DEVICE_BYTES,
        max_model_len=max_model_len,
        max_num_batched_tokens=16384,
        cudagraph_memory_profiled=False,  # "Available KV cache memory" = requested - weights - activation - non-torch
    )
    estimated = predict(model, settings)
    assert estimated.max_model_len == logged_length
    # The planner's own overhead estimates: within 1% of the tokens vLLM allocated (Qwen2.5-7B -0.23%, Llama -0.50%).
    assert abs(estimated.capacity.tokens - tokens) / tokens < 0.01
    # The overheads vLLM measured: within 0.3% (what remains is the weights, the index's bytes against vLLM's load).
    measured = predict(
        model,
        dataclasses.replace(
            settings,
            activation_peak_bytes=int(float(usage[2]) * GiB),
            non_torch_bytes=int(float(usage[3]) * GiB),
        ),
    )
    assert abs(measured.capacity.tokens - tokens) / tokens < 0.003


def test_fixed_space_of_the_lab_model_on_the_cpu_backend() -> None:
    # The lab's generated Qwen2 (shared/lab.md): hidden 128, 2 heads, 1 KV head of 64, 2 layers, served with
    # VLLM_CPU_KVCACHE_SPACE=1 and --max-model-len 512.
    lab = shape_from_config(
        {
            "model_type": "qwen2",
            "hidden_size": 128,
            "num_attention_heads": 2,
            "num_key_value_heads": 1,
            "head_dim": 64,
            "num_hidden_layers": 2,
            "vocab_size": 512,
            "max_position_embeddings": 512,
            "torch_dtype": "bfloat16",
            "tie_word_embeddings": True,
        }
    )
    capacity = predict_fixed_space(lab, 1 * GiB, max_model_len=512)
    # Pages of 2 x 16 x 1 x 64 x 2 = 4,096 bytes; 2^30 // 4,096 // 2 layers = 131,072 blocks of 16 tokens.
    assert capacity.num_blocks == 2**30 // (2 * 16 * 1 * 64 * 2) // 2 == 131_072
    # 131,072 x 16 tokens; a 512-token request takes 32 blocks: 131,072 / 32.
    assert capacity.log_lines() == (
        "GPU KV cache size: 2,097,152 tokens",
        "Maximum concurrency for 512 tokens per request: 4096.00x",
    )


def test_fixed_space_sliding_window_holds_only_the_window() -> None:
    mistral = shape("mistralai--Mistral-7B-v0.1")
    capacity = predict_fixed_space(mistral, 4 * GiB, max_model_len=32768, max_num_batched_tokens=2048)
    # Pages of 2 x 16 x 8 x 128 x 2 = 65,536 bytes per layer; 4 GiB // 65,536 // 32 layers = 2,048 blocks.
    assert capacity.num_blocks == 4 * GiB // (2 * 16 * 8 * 128 * 2) // 32 == 2048
    assert capacity.tokens == 2048 * 16
    # A request keeps min(4096 - 1 + 2048, 32768) = 6,143 tokens per layer: cdiv(6143, 16) + 1 = 385 blocks.
    assert capacity.blocks_per_request == math.ceil(6143 / 16) + 1 == 385
    assert capacity.log_lines()[1] == f"Maximum concurrency for 32,768 tokens per request: {2048 / 385:.2f}x"
    # With the hybrid manager off every layer is full: 32768 / 16 = 2,048 blocks, exactly one request.
    full = predict_fixed_space(mistral, 4 * GiB, max_model_len=32768, hybrid_kv_cache_manager=False)
    assert (full.blocks_per_request, full.max_concurrency) == (2048, 1.0)


def test_fixed_space_gemma2_two_groups() -> None:
    gemma = read_model_dir(str(CONFIGS / "google--gemma-2-9b-it"))
    groups = kv_groups(layer_kv(gemma))
    # 21 local + 21 global layers: a group of each, 21 layers apiece (local layers are the even ones).
    assert [len(group) for group in groups.groups] == [21, 21]
    assert groups.groups[0] == tuple(range(0, 42, 2))
    capacity = predict_fixed_space(gemma, 8 * GiB, max_model_len=8192, max_num_batched_tokens=2048)
    # Pages of 2 x 16 x 8 x 256 x 2 = 131,072 bytes; 8 GiB // 131,072 // 21 layers a group = 3,120 blocks.
    page = 2 * 16 * 8 * 256 * 2
    assert capacity.num_blocks == 8 * GiB // page // 21 == 3120
    # Tokens: 3,120 // 2 groups x 16.
    assert capacity.tokens == 3120 // 2 * 16 == 24_960
    # A request: global cdiv(8192, 16) = 512 blocks + local cdiv(min(4095 + 2048, 8192), 16) + 1 = 385.
    assert capacity.blocks_per_request == 512 + 385
    assert capacity.log_lines()[1] == "Maximum concurrency for 8,192 tokens per request: 3.48x"


def test_fixed_space_medgemma_pads_its_groups() -> None:
    gemma = read_model_dir(str(CONFIGS / "google--medgemma-27b-it"))
    groups = kv_groups(layer_kv(gemma))
    # 52 local and 10 global layers: the group size is the fewer, 10 (52 is not under 1.5 x 10); the 52 local
    # layers are dealt round-robin into cdiv(52, 10) = 6 groups (9, 9, 9, 9, 8, 8), the global ones into 1.
    assert [len(group) for group in groups.groups] == [9, 9, 9, 9, 8, 8, 10]
    capacity = predict_fixed_space(gemma, 16 * GiB, max_model_len=32768, max_num_batched_tokens=8192)
    page = 2 * 16 * 16 * 128 * 2
    assert capacity.num_blocks == 16 * GiB // page // 10 == 13_107
    assert capacity.tokens == 13_107 // 7 * 16 == 29_952
    # Six local groups of cdiv(min(1023 + 8192, 32768), 16) + 1 = 577 blocks, one global of 32768 / 16 = 2048.
    assert capacity.blocks_per_request == 6 * (math.ceil(9215 / 16) + 1) + 2048 == 5510
    assert capacity.log_lines()[1] == "Maximum concurrency for 32,768 tokens per request: 2.38x"


def test_fixed_space_deepseek_v3_mla() -> None:
    deepseek = shape("deepseek-ai--DeepSeek-V3")
    capacity = predict_fixed_space(deepseek, 8 * GiB)
    # MLA pages of 64 tokens (FlashMLA's block size) x 576 x 2 bytes = 73,728; 8 GiB // 73,728 // 61 layers.
    assert capacity.block_size == 64
    assert capacity.num_blocks == 8 * GiB // (64 * 576 * 2) // 61 == 1909
    assert capacity.tokens == 1909 * 64
    # max_position_embeddings 163,840 tokens take 2,560 blocks: not even one request fits.
    assert capacity.blocks_per_request == 163_840 // 64
    assert capacity.log_lines()[1] == "Maximum concurrency for 163,840 tokens per request: 0.75x"
    assert not capacity.fits_one_request
    assert capacity.bytes_needed_per_request == 61 * 64 * 576 * 2 * 2560


# --- the prediction on GPUs -------------------------------------------------------------------------------


def test_prediction_budget_is_explicit() -> None:
    llama = read_model_dir(str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B"))
    settings = InstanceSettings(gpu_memory_bytes=H100_BYTES, gpu_memory_utilization=0.9, max_model_len=8192)
    prediction = predict(llama, settings)
    # requested - weights - activation peak - non-torch - CUDA graphs is what the KV cache gets.
    assert prediction.kv_cache_bytes == (
        int(H100_BYTES * 0.9)
        - 16_060_522_496
        - prediction.activation_peak_bytes
        - prediction.non_torch_bytes
        - prediction.cudagraph_bytes
    )
    assert prediction.cudagraph_bytes > 0 and prediction.non_torch_bytes > 0
    # The KV cache holds kv_cache_bytes // (32 layers x 65,536-byte pages) blocks of 16 tokens.
    assert prediction.capacity.num_blocks == prediction.kv_cache_bytes // (2 * 16 * 8 * 128 * 2) // 32
    assert prediction.kv_bytes_per_token == (("full_attention", 131_072),)
    # Measured overheads replace the estimates; enforce_eager has no CUDA graphs.
    eager = predict(llama, InstanceSettings(gpu_memory_bytes=H100_BYTES, enforce_eager=True, activation_peak_bytes=GiB))
    assert (eager.cudagraph_bytes, eager.activation_peak_bytes) == (0, GiB)


def test_pipeline_parallel_takes_the_fullest_stage() -> None:
    llama = shape("meta-llama--Meta-Llama-3.1-70B", 141_107_412_992)
    prediction = predict(
        llama, InstanceSettings(gpu_memory_bytes=H100_BYTES, pipeline_parallel_size=3, max_model_len=8192)
    )
    # The first stage (27 layers and the embedding) is the fullest; the blocks are the fewest any stage holds.
    weights = stage_weights_bytes(llama, 1, 3)
    assert prediction.weights_bytes_per_gpu == weights[0]
    page = 2 * 16 * 8 * 128 * 2
    rooms = [int(H100_BYTES * 0.9) - stage - prediction.overhead_bytes for stage in weights]
    assert prediction.capacity.num_blocks == min(room // page // layers for room, layers in zip(rooms, [27, 27, 26]))


def test_default_batch_limits() -> None:
    assert default_batch_limits(H100_BYTES, "NVIDIA H100 80GB HBM3") == (8192, 1024)
    assert default_batch_limits(H100_BYTES, "NVIDIA A100-SXM4-80GB") == (2048, 256)
    assert default_batch_limits(48 * GiB) == (2048, 256)


# --- the verdict ------------------------------------------------------------------------------------------


def test_a_70b_model_at_tp_1_on_an_80_gb_gpu_is_refused_with_tp_4() -> None:
    llama = shape("meta-llama--Meta-Llama-3.1-70B", 141_107_412_992)
    verdict = fits(llama, InstanceSettings(gpu_memory_bytes=H100_BYTES))
    assert not verdict.fits
    # The number that does not fit: 141 GB of weights against 0.9 x 79.19 GiB.
    assert verdict.problem.startswith("weights 131.42 GiB + activations")
    assert "exceed the 71.27 GiB vLLM may use (0.9 x 79.19 GiB) at tensor_parallel_size 1" in verdict.problem
    # At TP 2 the weights fit but one request of 131,072 tokens (20 GiB of KV per GPU) does not: TP 4.
    assert [(fix.setting, fix.value) for fix in verdict.fixes] == [("tensor_parallel_size", 4)]
    assert verdict.message().endswith("fix: tensor_parallel_size 4")


def test_a_70b_model_with_a_short_context_fits_at_tp_2() -> None:
    llama = shape("meta-llama--Meta-Llama-3.1-70B", 141_107_412_992)
    verdict = fits(llama, InstanceSettings(gpu_memory_bytes=H100_BYTES, max_model_len=8192))
    assert verdict.fix is not None and (verdict.fix.setting, verdict.fix.value) == ("tensor_parallel_size", 2)
    assert fits(llama, InstanceSettings(gpu_memory_bytes=H100_BYTES, tensor_parallel_size=2, max_model_len=8192)).fits


def test_a_request_that_does_not_fit_names_each_single_fix() -> None:
    llama = shape("meta-llama--Meta-Llama-3.1-70B", 141_107_412_992)
    settings = InstanceSettings(gpu_memory_bytes=H100_BYTES, tensor_parallel_size=2, max_model_len=32768)
    verdict = fits(llama, settings)
    assert not verdict.fits
    # 32,768 tokens x 80 layers x 2 x 4 KV heads x 128 x 2 bytes = 5 GiB per GPU.
    assert verdict.prediction.capacity.bytes_needed_per_request == 32768 * 80 * 2 * 4 * 128 * 2 == 5 * GiB
    assert verdict.problem.startswith("one request of max_model_len 32,768 tokens needs 5.00 GiB of KV cache per GPU")
    settings_fixed = [fix.setting for fix in verdict.fixes]
    assert settings_fixed == ["gpu_memory_utilization", "kv_cache_dtype", "max_model_len", "tensor_parallel_size"]
    utilization, dtype, length, tp = verdict.fixes
    assert utilization.value <= 0.95 and dtype.value == "fp8" and tp.value == 4
    # The largest max_model_len that fits is a whole number of 16-token blocks that fits the room left, and one
    # block more does not.
    room = verdict.prediction.kv_cache_bytes
    per_token = 80 * 2 * 4 * 128 * 2
    assert isinstance(length.value, int) and length.value % 16 == 0
    assert length.value * per_token <= room < (length.value + 16) * per_token
    for fix in verdict.fixes:
        assert fits(llama, dataclasses.replace(settings, **{fix.setting: fix.value})).fits, fix


def test_a_tp_size_that_does_not_divide_the_heads_is_refused() -> None:
    with pytest.raises(CapacityError, match="32 attention heads are not divisible by tensor_parallel_size 3"):
        predict(
            shape("Qwen--Qwen3-8B", 16_381_470_720),
            InstanceSettings(gpu_memory_bytes=H100_BYTES, tensor_parallel_size=3),
        )


def test_a_shape_without_weights_is_refused() -> None:
    with pytest.raises(CapacityError, match="no weights for Qwen3ForCausalLM: stage model.safetensors.index.json"):
        predict(shape("Qwen--Qwen3-8B"), InstanceSettings(gpu_memory_bytes=H100_BYTES))


def test_an_unknown_kv_cache_dtype_is_refused() -> None:
    with pytest.raises(CapacityError, match="kv_cache_dtype 'int4' cannot be sized"):
        kv_bytes_per_token(shape("Qwen--Qwen3-8B"), "int4")
