"""model_shape (issue 34): the shape of a staged model from the real published config.json of eleven models
(tests/fixtures/model_configs, sources in its README), each with its expected numbers worked out by hand from the
config's own fields; and the refusals: no config.json, a family or quantisation the planner does not know, a field
it would have to guess."""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.model_shape import (
    MLA,
    MoE,
    ShapeError,
    Weights,
    quantization_of,
    read_model_dir,
    read_safetensors_header,
    shape_from_config,
    weights_from_headers,
    weights_from_index,
)

CONFIGS = Path(__file__).resolve().parents[1] / "fixtures" / "model_configs"


def config(name: str) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((CONFIGS / name / "config.json").read_text())
    return data


def write_safetensors(path: Path, tensors: dict[str, tuple[str, list[int]]], data_bytes: int = 16) -> None:
    """A safetensors file: the 8-byte length, the JSON header, then data_bytes of (fake) tensor data."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, (dtype, shape) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset]}
    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data_bytes)


# --- the real configs, worked out by hand ------------------------------------------------------------------


def test_llama_3_1_8b_from_its_staged_directory() -> None:
    shape = read_model_dir(str(CONFIGS / "meta-llama--Meta-Llama-3.1-8B"))
    assert (shape.model_type, shape.architecture, shape.dtype) == ("llama", "LlamaForCausalLM", "bfloat16")
    # No head_dim in the config: hidden_size / num_attention_heads = 4096 / 32.
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (32, 32, 8, 128)
    assert shape.layer_windows == (None,) * 32 and shape.moe is None and shape.mla is None
    assert shape.quantization is None and not shape.has_vision_tower
    assert shape.max_position_embeddings == 131072
    # Parameters from config.json: embed_tokens and the untied lm_head, 128256 x 4096 each;
    # per layer q 4096x4096, k and v 1024x4096 (8 KV heads x 128), o 4096x4096, gate/up/down 14336x4096 each,
    # two RMSNorms of 4096; the final norm 4096.
    embeddings = 2 * 128256 * 4096
    per_layer = 4096 * 4096 + 2 * 1024 * 4096 + 4096 * 4096 + 3 * 14336 * 4096 + 2 * 4096
    parameters = embeddings + 32 * per_layer + 4096
    assert parameters == 8_030_261_248
    # bfloat16: 2 bytes each, what the index declares.
    assert shape.weights == Weights(2 * parameters, (), "model.safetensors.index.json")
    assert shape.weights.total_bytes == 16_060_522_496


def test_llama_3_1_70b() -> None:
    shape = shape_from_config(config("meta-llama--Meta-Llama-3.1-70B"))
    # 8192 / 64 heads = 128.
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (80, 64, 8, 128)
    assert shape.weights is None and shape.intermediate_size == 28672
    # The bytes a bf16 checkpoint holds (no index staged here): embed + lm_head 128256 x 8192 each; per layer
    # q and o 8192x8192, k and v 1024x8192, gate/up/down 28672x8192, two norms; the final norm.
    per_layer = 2 * 8192 * 8192 + 2 * 1024 * 8192 + 3 * 28672 * 8192 + 2 * 8192
    assert 2 * (2 * 128256 * 8192 + 80 * per_layer + 8192) == 141_107_412_992


def test_qwen3_8b_dense() -> None:
    shape = shape_from_config(config("Qwen--Qwen3-8B"))
    assert shape.model_type == "qwen3" and shape.family == "qwen3"
    # head_dim 128 given; 8 KV heads; "sliding_window": null and use_sliding_window false.
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (36, 32, 8, 128)
    assert shape.layer_windows == (None,) * 36 and not shape.tie_word_embeddings
    # embed + lm_head 151936 x 4096; per layer q 4096x4096, k/v 1024x4096, o 4096x4096, q_norm/k_norm 128 each,
    # gate/up/down 12288x4096, two norms of 4096; the final norm.
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 2 * 128 + 3 * 12288 * 4096 + 2 * 4096
    assert 2 * (2 * 151936 * 4096 + 36 * per_layer + 4096) == 16_381_470_720


def test_qwen3_30b_a3b_moe() -> None:
    shape = shape_from_config(config("Qwen--Qwen3-30B-A3B"))
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (48, 32, 4, 128)
    # 128 experts of moe_intermediate_size 768, 8 per token, no shared expert; decoder_sparse_step 1 and no
    # mlp_only_layers: every one of the 48 layers is MoE.
    assert shape.moe == MoE(128, 8, 768, 0, 48)
    # embed + lm_head 151936 x 2048; per layer q 2048->4096 (32x128), k/v 2048->512 (4x128), o 4096->2048,
    # q/k norms 128, 128 experts x (gate, up, down) of 768x2048, the router 128x2048, two norms of 2048.
    per_layer = 2 * 2048 * 4096 + 2 * 2048 * 512 + 2 * 128 + 128 * 3 * 768 * 2048 + 128 * 2048 + 2 * 2048
    assert 2 * (2 * 151936 * 2048 + 48 * per_layer + 2048) == 61_064_245_248


def test_qwen3_30b_a3b_fp8_is_read_as_fp8_with_16_bit_activations() -> None:
    shape = shape_from_config(config("Qwen--Qwen3-30B-A3B-FP8"))
    assert shape.quantization is not None
    assert (shape.quantization.method, shape.quantization.weight_bits) == ("fp8", 8)
    assert shape.quantization.detail == "block 128x128, dynamic activations"
    # The activations (and an 'auto' KV cache) stay in torch_dtype.
    assert shape.dtype == "bfloat16" and shape.dtype_bytes == 2
    assert shape.moe == MoE(128, 8, 768, 0, 48)


def test_qwen2_5_7b_ignores_the_sliding_window_it_does_not_use() -> None:
    shape = shape_from_config(config("Qwen--Qwen2.5-7B"))
    # "sliding_window": 131072 with "use_sliding_window": false: every layer is full attention.
    assert shape.layer_windows == (None,) * 28
    # No head_dim: 3584 / 28 = 128; 4 KV heads.
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (28, 28, 4, 128)
    # embed + lm_head 152064 x 3584; per layer q 3584x3584 + bias 3584, k/v 3584x512 + bias 512 each, o 3584x3584,
    # gate/up/down 18944x3584, two norms of 3584; the final norm.
    per_layer = (3584 * 3584 + 3584) + 2 * (3584 * 512 + 512) + 3584 * 3584 + 3 * 18944 * 3584 + 2 * 3584
    assert 2 * (2 * 152064 * 3584 + 28 * per_layer + 3584) == 15_231_233_024


def test_qwen2_with_use_sliding_window_slides_from_max_window_layers() -> None:
    qwen = config("Qwen--Qwen2.5-7B") | {"use_sliding_window": True, "sliding_window": 4096, "max_window_layers": 20}
    shape = shape_from_config(qwen)
    assert shape.layer_windows == (None,) * 20 + (4096,) * 8


def test_mistral_7b_v0_1_slides_every_layer() -> None:
    shape = shape_from_config(config("mistralai--Mistral-7B-v0.1"))
    assert shape.layer_windows == (4096,) * 32 and shape.sliding_layers == 32 and shape.full_layers == 0
    assert (shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (32, 8, 128)
    # Llama-8B's layers with a 32000-token vocabulary: embed + lm_head 32000 x 4096.
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 3 * 14336 * 4096 + 2 * 4096
    assert 2 * (2 * 32000 * 4096 + 32 * per_layer + 4096) == 14_483_464_192


def test_mixtral_8x7b_from_its_staged_directory() -> None:
    shape = read_model_dir(str(CONFIGS / "mistralai--Mixtral-8x7B-v0.1"))
    # num_local_experts 8, 2 per token, each expert's MLP of intermediate_size 14336; no sliding window.
    assert shape.moe == MoE(8, 2, 14336, 0, 32)
    assert shape.layer_windows == (None,) * 32
    # embed + lm_head 32000 x 4096; per layer the attention of Mistral-7B, 8 experts x 3 x 14336x4096, the router
    # 8x4096 and two norms.
    per_layer = 2 * 4096 * 4096 + 2 * 1024 * 4096 + 8 * 3 * 14336 * 4096 + 8 * 4096 + 2 * 4096
    assert shape.weights is not None
    assert shape.weights.total_bytes == 2 * (2 * 32000 * 4096 + 32 * per_layer + 4096) == 93_405_585_408


def test_deepseek_v3_is_mla_moe_fp8() -> None:
    shape = shape_from_config(config("deepseek-ai--DeepSeek-V3"))
    assert shape.model_type == "deepseek_v3" and shape.family == "deepseek"
    assert shape.mla == MLA(
        kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128, q_lora_rank=1536
    )
    # The latent cached per token and layer: kv_lora_rank + qk_rope_head_dim = 512 + 64.
    assert shape.mla is not None and shape.mla.cache_width == 576
    # Query/key head size qk_nope + qk_rope = 128 + 64.
    assert (shape.num_layers, shape.num_attention_heads, shape.head_size) == (61, 128, 192)
    # 256 routed experts of 2048, 8 per token, 1 shared expert of 2048; first_k_dense_replace 3: 58 MoE layers.
    assert shape.moe == MoE(256, 8, 2048, 2048, 61 - 3)
    assert shape.quantization is not None
    assert (shape.quantization.method, shape.quantization.weight_bits) == ("fp8", 8)


def test_gemma_2_9b_it_alternates_local_and_global_layers() -> None:
    shape = read_model_dir(str(CONFIGS / "google--gemma-2-9b-it"))
    # head_dim 256 (not 3584 / 16 = 224); 8 KV heads; local (4096 tokens) and global layers alternate, local first.
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (42, 16, 8, 256)
    assert shape.layer_windows == (4096, None) * 21
    assert shape.tie_word_embeddings  # Gemma ties its embeddings; the config does not say
    # embed 256000 x 3584 (tied, no lm_head); per layer q 3584->4096 (16x256), k/v 3584->2048 (8x256),
    # o 4096->3584, gate/up/down 14336x3584, four norms of 3584; the final norm.
    per_layer = 3584 * 4096 + 2 * 3584 * 2048 + 4096 * 3584 + 3 * 14336 * 3584 + 4 * 3584
    parameters = 256000 * 3584 + 42 * per_layer + 3584
    assert parameters == 9_241_705_984
    assert shape.weights is not None and shape.weights.total_bytes == 2 * parameters == 18_483_411_968


def test_medgemma_27b_is_gemma3_with_a_vision_tower() -> None:
    shape = read_model_dir(str(CONFIGS / "google--medgemma-27b-it"))
    assert (shape.model_type, shape.text_model_type) == ("gemma3", "gemma3_text")
    assert shape.has_vision_tower
    assert (shape.num_layers, shape.num_attention_heads, shape.num_kv_heads, shape.head_size) == (62, 32, 16, 128)
    # layer_types: five local layers of 1024 tokens, then a global one; 62 layers = 10 x 6 + 2 local.
    assert shape.layer_windows == ((1024,) * 5 + (None,)) * 10 + (1024, 1024)
    assert (shape.sliding_layers, shape.full_layers) == (52, 10)
    # Text: embed 262208 x 5376 (tied); per layer q 5376->4096, k/v 5376->2048, o 4096->5376, q/k norms 128,
    # gate/up/down 21504x5376, four norms; the final norm.
    text = 262208 * 5376 + 62 * (5376 * 4096 + 2 * 5376 * 2048 + 4096 * 5376 + 2 * 128 + 3 * 21504 * 5376 + 4 * 5376)
    text += 5376
    # Vision (SigLIP, vision_config): patch conv 3x14x14 -> 1152 + bias, 64x64 position embeddings of 1152;
    # 27 layers of q/k/v/o 1152x1152 + bias, fc1 1152->4304 + bias, fc2 4304->1152 + bias, two LayerNorms
    # (weight + bias); the post LayerNorm; the projector 1152x5376 and its norm of 1152.
    vision_layer = 4 * (1152 * 1152 + 1152) + (1152 * 4304 + 4304) + (4304 * 1152 + 1152) + 2 * 2 * 1152
    vision = (3 * 14 * 14 * 1152 + 1152) + (896 // 14) ** 2 * 1152 + 27 * vision_layer + 2 * 1152
    vision += 1152 * 5376 + 1152
    assert (text, vision) == (27_009_346_304, 423_060_336)
    assert shape.weights is not None and shape.weights.total_bytes == 2 * (text + vision) == 54_864_813_280


def test_gemma3_sliding_window_pattern_without_layer_types() -> None:
    text = config("google--medgemma-27b-it")["text_config"]
    del text["layer_types"]
    shape = shape_from_config({"model_type": "gemma3", "text_config": text | {"sliding_window_pattern": 6}})
    assert shape.layer_windows == ((1024,) * 5 + (None,)) * 10 + (1024, 1024)
    assert not shape.has_vision_tower


# --- weights from the index and the safetensors headers -------------------------------------------------


def test_weights_from_headers_by_dtype_read_only_the_header(tmp_path: Path) -> None:
    # An fp8 block-quantised layer: weights in F8_E4M3, their scales F32, a norm BF16.
    shard = tmp_path / "model.safetensors"
    write_safetensors(
        shard,
        {
            "w": ("F8_E4M3", [2048, 7168]),
            "w_scale_inv": ("F32", [16, 56]),
            "norm": ("BF16", [7168]),
        },
    )
    header = read_safetensors_header(str(shard))
    weights = weights_from_headers([header])
    # 2048 x 7168 x 1 byte, 16 x 56 x 4 bytes, 7168 x 2 bytes; the file holds 16 bytes of data, never read.
    assert weights.dtype_bytes() == {"F8_E4M3": 2048 * 7168, "F32": 16 * 56 * 4, "BF16": 7168 * 2}
    assert weights.total_bytes == 2048 * 7168 + 16 * 56 * 4 + 7168 * 2


def test_a_directory_without_index_is_read_from_its_headers(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "Qwen--Qwen3-8B" / "config.json", tmp_path / "config.json")
    write_safetensors(
        tmp_path / "model-00001-of-00002.safetensors", {"model.embed_tokens.weight": ("BF16", [151936, 4096])}
    )
    write_safetensors(tmp_path / "model-00002-of-00002.safetensors", {"lm_head.weight": ("BF16", [151936, 4096])})
    shape = read_model_dir(str(tmp_path))
    assert shape.weights is not None
    assert shape.weights.total_bytes == 2 * 151936 * 4096 * 2
    assert shape.weights.source == "safetensors headers (2 files)"


def test_staged_shards_give_the_index_bytes_per_dtype_and_must_agree(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "Qwen--Qwen3-8B" / "config.json", tmp_path / "config.json")
    write_safetensors(tmp_path / "a.safetensors", {"x": ("BF16", [4, 4])})
    index = {"metadata": {"total_size": 32}, "weight_map": {"x": "a.safetensors"}}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    shape = read_model_dir(str(tmp_path))
    assert shape.weights is not None and shape.weights.dtype_bytes() == {"BF16": 32}
    index["metadata"] = {"total_size": 64}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ShapeError, match="declares 64 bytes but the headers of its 1 shards hold 32"):
        read_model_dir(str(tmp_path))


def test_a_truncated_or_absurd_header_is_refused(tmp_path: Path) -> None:
    short = tmp_path / "short.safetensors"
    short.write_bytes(struct.pack("<Q", 100) + b"{}")
    with pytest.raises(ShapeError, match="ends inside its 100-byte header"):
        read_safetensors_header(str(short))
    huge = tmp_path / "huge.safetensors"
    huge.write_bytes(struct.pack("<Q", 1 << 40))
    with pytest.raises(ShapeError, match="more than safetensors allows"):
        read_safetensors_header(str(huge))


def test_an_unknown_tensor_dtype_is_refused() -> None:
    with pytest.raises(ShapeError, match="tensor w has dtype F4"):
        weights_from_headers([{"w": {"dtype": "F4", "shape": [2, 2]}}])


def test_an_index_without_total_size_is_refused() -> None:
    with pytest.raises(ShapeError, match="has no metadata.total_size"):
        weights_from_index({"metadata": {}, "weight_map": {}})


# --- quantisation ------------------------------------------------------------------------------------------


def test_awq_and_gptq_4_bit_are_sized() -> None:
    # quantization_config blocks shaped like those of AutoAWQ and GPTQ checkpoints (written here, not copied).
    awq = {"bits": 4, "group_size": 128, "modules_to_not_convert": None, "quant_method": "awq", "zero_point": True}
    gptq = {"bits": 4, "desc_act": False, "group_size": 128, "quant_method": "gptq", "sym": True}
    for block, method in ((awq, "awq"), (gptq, "gptq")):
        quant = quantization_of(config("Qwen--Qwen2.5-7B") | {"quantization_config": block}, "qwen2")
        assert quant is not None and (quant.method, quant.weight_bits, quant.detail) == (method, 4, "group 128")


def test_an_unknown_quant_method_is_refused() -> None:
    broken = config("Qwen--Qwen2.5-7B") | {
        "quantization_config": {"quant_method": "bitsandbytes", "load_in_4bit": True}
    }
    with pytest.raises(
        ShapeError, match="model_type qwen2 declares quant_method bitsandbytes, which the planner cannot size"
    ):
        shape_from_config(broken)


def test_awq_with_other_than_4_bits_is_refused() -> None:
    broken = config("Qwen--Qwen2.5-7B") | {"quantization_config": {"quant_method": "awq", "bits": 3}}
    with pytest.raises(ShapeError, match="declares awq with bits = 3"):
        shape_from_config(broken)


def test_a_quantization_config_without_method_is_refused() -> None:
    with pytest.raises(ShapeError, match="quantization_config with no quant_method"):
        shape_from_config(config("Qwen--Qwen3-8B") | {"quantization_config": {"bits": 4}})


# --- refusals: a shape the planner does not know is never guessed -----------------------------------------


def test_a_missing_kv_head_count_is_refused_by_name() -> None:
    broken = config("meta-llama--Meta-Llama-3.1-8B")
    del broken["num_key_value_heads"]
    with pytest.raises(ShapeError, match="^unknown shape: model_type llama has no num_key_value_heads$"):
        shape_from_config(broken)


@pytest.mark.parametrize(
    ("fixture", "field"),
    [
        ("Qwen--Qwen3-30B-A3B", "num_experts"),
        ("mistralai--Mixtral-8x7B-v0.1", "num_local_experts"),
        ("deepseek-ai--DeepSeek-V3", "kv_lora_rank"),
        ("Qwen--Qwen3-8B", "num_hidden_layers"),
        ("google--gemma-2-9b-it", "head_dim"),
        ("mistralai--Mistral-7B-v0.1", "torch_dtype"),
    ],
)
def test_a_missing_field_is_named(fixture: str, field: str) -> None:
    broken = config(fixture)
    del broken[field]
    with pytest.raises(ShapeError, match=f"model_type {broken['model_type']} has no {field}"):
        shape_from_config(broken)


def test_gemma3_without_layer_types_or_pattern_is_refused() -> None:
    text = config("google--medgemma-27b-it")["text_config"]
    del text["layer_types"]
    with pytest.raises(ShapeError, match="model_type gemma3_text has no layer_types or sliding_window_pattern"):
        shape_from_config({"model_type": "gemma3", "text_config": text})


def test_an_unknown_family_is_refused() -> None:
    phi = config("meta-llama--Meta-Llama-3.1-8B") | {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"]}
    with pytest.raises(ShapeError, match="unknown shape: model_type phi3 is not a family the planner knows"):
        shape_from_config(phi)


def test_an_unknown_layer_type_is_refused() -> None:
    qwen = config("Qwen--Qwen3-8B") | {"layer_types": ["linear_attention"] * 36}
    with pytest.raises(ShapeError, match="model_type qwen3 has a layer of type 'linear_attention'"):
        shape_from_config(qwen)


def test_a_config_without_model_type_is_refused() -> None:
    broken = config("Qwen--Qwen3-8B")
    del broken["model_type"]
    with pytest.raises(ShapeError, match="config.json has no model_type"):
        shape_from_config(broken)


def test_a_model_directory_without_config_json_is_refused(tmp_path: Path) -> None:
    write_safetensors(tmp_path / "model.safetensors", {"x": ("BF16", [2])})
    with pytest.raises(ShapeError, match="has no config.json"):
        read_model_dir(str(tmp_path))


def test_a_model_directory_without_weights_is_refused(tmp_path: Path) -> None:
    shutil.copy(CONFIGS / "Qwen--Qwen3-8B" / "config.json", tmp_path / "config.json")
    with pytest.raises(ShapeError, match="no model.safetensors.index.json and no \\*.safetensors file"):
        read_model_dir(str(tmp_path))
