# -*- coding: utf-8 -*-
"""The shape of a staged Hugging Face model, read without loading it: what the capacity planner sizes (issue 34).

Input is what model_store stages: `config.json` (with `text_config` for a multimodal wrapper such as Gemma 3),
`model.safetensors.index.json` (`metadata.total_size`, `weight_map`) or, without an index, the headers of the
`*.safetensors` files (8 bytes little-endian u64 = header length, then a JSON header of dtype and shape per
tensor; the weights after it are never read). The result is a frozen `ModelShape`: layers, attention and KV
heads, head size, the sliding window of each layer, MoE experts, DeepSeek's MLA latent, quantisation, whether a
vision tower is present, and the parameter bytes the checkpoint holds (in total and per dtype).

Families: Llama, Mistral, Mixtral, Qwen2, Qwen3, Qwen2-MoE, Qwen3-MoE, DeepSeek-V2/V3 (MLA), Gemma, Gemma 2 and
Gemma 3 (text, and the multimodal wrapper). Anything else, or a field the family needs that the config lacks,
raises ShapeError naming the model_type and the field: the planner never guesses a shape. The only defaults
taken are the ones the model's own definition states (a head size of hidden_size / num_attention_heads when
head_dim is absent, except for Gemma whose head size is not that ratio; Gemma 2's alternating local/global layers,
which transformers' Gemma2Config and vLLM's gemma2.py hard-code; Qwen's `use_sliding_window` false, the
Qwen2Config default). Controller-only (plugin_utils); standard library only.
"""

from __future__ import annotations

import json
import os
import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

# Bytes per element of each safetensors dtype (the safetensors format's dtype list). Sub-byte packed types
# (F4, F6_*) are refused: their bytes per element depend on the packing.
SAFETENSORS_DTYPE_BYTES = {
    "F64": 8,
    "F32": 4,
    "F16": 2,
    "BF16": 2,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "F8_E8M0": 1,
    "I64": 8,
    "I32": 4,
    "I16": 2,
    "I8": 1,
    "U64": 8,
    "U32": 4,
    "U16": 2,
    "U8": 1,
    "BOOL": 1,
}
# The checkpoint dtypes config.json may declare (torch_dtype, or dtype in newer transformers).
TORCH_DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
# The safetensors format refuses headers above 100 MB; so does this reader (a corrupt length reads no further).
MAX_HEADER_BYTES = 100 * 1024 * 1024

# model_type of the text model -> family.
FAMILIES = {
    "llama": "llama",
    "mistral": "mistral",
    "mixtral": "mixtral",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "qwen2_moe": "qwen2_moe",
    "qwen3_moe": "qwen3_moe",
    "deepseek_v2": "deepseek",
    "deepseek_v3": "deepseek",
    "gemma": "gemma",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}
# Multimodal wrappers: top-level model_type -> the model_type its text_config must have.
WRAPPERS = {"gemma3": "gemma3_text"}
QWEN_FAMILIES = ("qwen2", "qwen3", "qwen2_moe", "qwen3_moe")
GEMMA_FAMILIES = ("gemma", "gemma2", "gemma3")
# Weight-name prefixes of a vision tower in the checkpoints of the families above.
VISION_PREFIXES = ("vision_tower.", "visual.", "vision_model.", "model.vision_tower.", "model.visual.")
# quant_method -> weight bits it can be sized at.
QUANT_BITS = {"fp8": (8,), "awq": (4,), "gptq": (4, 8)}


class ShapeError(ValueError):
    """The shape cannot be read without guessing: the message names the model_type and what is missing."""


@dataclass(frozen=True)
class Quantization:
    method: str
    weight_bits: int
    detail: str = ""


@dataclass(frozen=True)
class MoE:
    num_experts: int
    experts_per_token: int
    expert_intermediate_size: int
    shared_intermediate_size: int  # 0 without shared experts
    moe_layers: int  # layers whose MLP is the routed experts (the others are dense)


@dataclass(frozen=True)
class MLA:
    """DeepSeek's multi-head latent attention: the KV cache holds one latent of kv_lora_rank + qk_rope_head_dim."""

    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None

    @property
    def cache_width(self) -> int:
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class Weights:
    """The parameter bytes a checkpoint holds. by_dtype is empty when only the index was read (it has no dtypes)."""

    total_bytes: int
    by_dtype: tuple[tuple[str, int], ...] = ()
    source: str = ""

    def dtype_bytes(self) -> dict[str, int]:
        return dict(self.by_dtype)


@dataclass(frozen=True)
class ModelShape:
    model_type: str  # config.json's model_type (the wrapper's, for a multimodal model)
    text_model_type: str
    architecture: str
    dtype: str  # the checkpoint dtype config.json declares
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_size: int
    intermediate_size: int | None
    vocab_size: int
    max_position_embeddings: int
    tie_word_embeddings: bool
    layer_windows: tuple[int | None, ...]  # per layer: None = full attention, N = sliding window of N tokens
    moe: MoE | None = None
    mla: MLA | None = None
    quantization: Quantization | None = None
    has_vision_tower: bool = False
    weights: Weights | None = None

    @property
    def family(self) -> str:
        return FAMILIES[self.text_model_type]

    @property
    def dtype_bytes(self) -> int:
        """Bytes of the dtype vLLM serves in with --dtype auto: a float32 checkpoint is served in 16 bits
        (vllm/config/model.py, _resolve_auto_dtype), the others in the dtype they declare."""
        return min(TORCH_DTYPE_BYTES[self.dtype], 2)

    @property
    def sliding_layers(self) -> int:
        return sum(1 for window in self.layer_windows if window is not None)

    @property
    def full_layers(self) -> int:
        return self.num_layers - self.sliding_layers

    def describe(self) -> str:
        parts = [
            f"{self.architecture or self.model_type} ({self.text_model_type}, {self.dtype})",
            f"{self.num_layers} layers",
            f"{self.num_attention_heads} heads / {self.num_kv_heads} KV heads of {self.head_size}",
        ]
        if self.sliding_layers:
            windows = sorted({window for window in self.layer_windows if window is not None})
            parts.append(f"{self.sliding_layers} sliding-window layers ({', '.join(map(str, windows))} tokens)")
        if self.mla is not None:
            parts.append(f"MLA latent {self.mla.kv_lora_rank} + rope {self.mla.qk_rope_head_dim}")
        if self.moe is not None:
            parts.append(f"{self.moe.num_experts} experts, {self.moe.experts_per_token} per token")
        if self.quantization is not None:
            parts.append(f"{self.quantization.method} {self.quantization.weight_bits}-bit")
        if self.has_vision_tower:
            parts.append("vision tower")
        if self.weights is not None:
            parts.append(f"{self.weights.total_bytes:,} bytes of weights")
        return ", ".join(parts)


def _unknown(model_type: str, what: str) -> ShapeError:
    return ShapeError(f"unknown shape: model_type {model_type} {what}")


def _field(config: Mapping[str, Any], model_type: str, name: str) -> Any:
    value = config.get(name)
    if value is None:
        raise _unknown(model_type, f"has no {name}")
    return value


def _int_field(config: Mapping[str, Any], model_type: str, name: str) -> int:
    value = _field(config, model_type, name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _unknown(model_type, f"has {name} = {value!r}, not a whole number")
    return value


def _positive(config: Mapping[str, Any], model_type: str, name: str) -> int:
    value = _int_field(config, model_type, name)
    if value == 0:
        raise _unknown(model_type, f"has {name} = 0")
    return value


def text_config_of(config: Mapping[str, Any]) -> tuple[str, str, Mapping[str, Any]]:
    """(model_type, the text model's model_type, the text model's config): a wrapper's text_config, else config."""
    model_type = config.get("model_type")
    if not isinstance(model_type, str) or not model_type:
        raise ShapeError("unknown shape: config.json has no model_type")
    if model_type in WRAPPERS:
        text = config.get("text_config")
        if not isinstance(text, Mapping):
            raise _unknown(model_type, "has no text_config")
        text_type = text.get("model_type", WRAPPERS[model_type])
        if text_type != WRAPPERS[model_type]:
            raise _unknown(model_type, f"has a text_config of model_type {text_type}, not {WRAPPERS[model_type]}")
        return model_type, text_type, text
    if model_type not in FAMILIES:
        known = ", ".join(sorted(set(FAMILIES) | set(WRAPPERS)))
        raise _unknown(model_type, f"is not a family the planner knows ({known})")
    return model_type, model_type, config


def _dtype(config: Mapping[str, Any], text: Mapping[str, Any], model_type: str) -> str:
    for source in (text, config):
        for key in ("torch_dtype", "dtype"):
            if source.get(key) is not None:
                value = str(source[key]).removeprefix("torch.")
                if value not in TORCH_DTYPE_BYTES:
                    raise _unknown(model_type, f"declares {key} {value}, which the planner cannot size")
                return value
    raise _unknown(model_type, "has no torch_dtype")


def _head_size(text: Mapping[str, Any], model_type: str, family: str, heads: int, hidden: int) -> int:
    if text.get("head_dim") is not None:
        return _positive(text, model_type, "head_dim")
    if family in GEMMA_FAMILIES:
        # Gemma's head size is not hidden_size / num_attention_heads (gemma-2-9b: 256, not 3584 / 16).
        raise _unknown(model_type, "has no head_dim")
    if hidden % heads:
        raise _unknown(model_type, f"has no head_dim and hidden_size {hidden} is not a multiple of {heads} heads")
    return hidden // heads


def _windows_from_layer_types(text: Mapping[str, Any], model_type: str, layers: int) -> tuple[int | None, ...]:
    layer_types = text["layer_types"]
    if not isinstance(layer_types, list) or len(layer_types) != layers:
        raise _unknown(model_type, f"has layer_types that do not name each of its {layers} layers")
    window: int | None = None
    if "sliding_attention" in layer_types:
        window = _positive(text, model_type, "sliding_window")
    windows: list[int | None] = []
    for kind in layer_types:
        if kind not in ("full_attention", "sliding_attention"):
            raise _unknown(model_type, f"has a layer of type {kind!r} (the planner sizes full and sliding attention)")
        windows.append(window if kind == "sliding_attention" else None)
    return tuple(windows)


def _pattern_windows(window: int, pattern: int, layers: int) -> tuple[int | None, ...]:
    """Every pattern-th layer global, the others local (transformers' Gemma2Config/Gemma3TextConfig layer_types)."""
    return tuple(None if (index + 1) % pattern == 0 else window for index in range(layers))


def layer_windows_of(text: Mapping[str, Any], model_type: str, family: str, layers: int) -> tuple[int | None, ...]:
    """The sliding window of each layer (None: full attention), as vLLM builds the attention layers."""
    if text.get("layer_types") is not None:
        return _windows_from_layer_types(text, model_type, layers)
    if family in ("mistral", "mixtral"):
        if text.get("sliding_window") is None:
            return (None,) * layers
        return (_positive(text, model_type, "sliding_window"),) * layers
    if family in QWEN_FAMILIES:
        # Qwen2Config: sliding_window applies only with use_sliding_window (default false), from layer
        # max_window_layers on; Qwen2.5 configs carry a sliding_window that is therefore unused.
        if not text.get("use_sliding_window"):
            return (None,) * layers
        window = _positive(text, model_type, "sliding_window")
        first = _int_field(text, model_type, "max_window_layers")
        return tuple(window if index >= first else None for index in range(layers))
    if family == "gemma2":
        # Alternating local/global (local first), hard-coded by transformers' Gemma2 and vLLM's gemma2.py.
        return _pattern_windows(_positive(text, model_type, "sliding_window"), 2, layers)
    if family == "gemma3":
        pattern = text.get("sliding_window_pattern", text.get("_sliding_window_pattern"))
        if pattern is None:
            raise _unknown(model_type, "has no layer_types or sliding_window_pattern")
        if isinstance(pattern, bool) or not isinstance(pattern, int) or pattern < 1:
            raise _unknown(model_type, f"has sliding_window_pattern = {pattern!r}")
        return _pattern_windows(_positive(text, model_type, "sliding_window"), pattern, layers)
    return (None,) * layers


def _moe_layer_count(text: Mapping[str, Any], model_type: str, family: str, layers: int) -> int:
    if family in ("qwen2_moe", "qwen3_moe"):
        step = text.get("decoder_sparse_step") or 1
        dense = set(text.get("mlp_only_layers") or ())
        return sum(1 for index in range(layers) if index not in dense and (index + 1) % step == 0)
    if family == "deepseek":
        first = _int_field(text, model_type, "first_k_dense_replace")
        freq = text.get("moe_layer_freq") or 1
        return sum(1 for index in range(layers) if index >= first and index % freq == 0)
    return layers


def moe_of(text: Mapping[str, Any], model_type: str, family: str, layers: int) -> MoE | None:
    """The routed experts (Mixtral's num_local_experts, Qwen's num_experts, DeepSeek's n_routed_experts)."""
    if family == "mixtral":
        experts = _positive(text, model_type, "num_local_experts")
        intermediate = _positive(text, model_type, "intermediate_size")
        shared = 0
    elif family in ("qwen2_moe", "qwen3_moe"):
        experts = _positive(text, model_type, "num_experts")
        intermediate = _positive(text, model_type, "moe_intermediate_size")
        shared = _positive(text, model_type, "shared_expert_intermediate_size") if family == "qwen2_moe" else 0
    elif family == "deepseek":
        experts = _positive(text, model_type, "n_routed_experts")
        intermediate = _positive(text, model_type, "moe_intermediate_size")
        shared = (text.get("n_shared_experts") or 0) * intermediate
    else:
        return None
    return MoE(
        num_experts=experts,
        experts_per_token=_positive(text, model_type, "num_experts_per_tok"),
        expert_intermediate_size=intermediate,
        shared_intermediate_size=shared,
        moe_layers=_moe_layer_count(text, model_type, family, layers),
    )


def mla_of(text: Mapping[str, Any], model_type: str, family: str) -> MLA | None:
    if family != "deepseek":
        return None
    q_lora = text.get("q_lora_rank")
    return MLA(
        kv_lora_rank=_positive(text, model_type, "kv_lora_rank"),
        qk_rope_head_dim=_positive(text, model_type, "qk_rope_head_dim"),
        qk_nope_head_dim=_positive(text, model_type, "qk_nope_head_dim"),
        v_head_dim=_positive(text, model_type, "v_head_dim"),
        q_lora_rank=None if q_lora is None else _positive(text, model_type, "q_lora_rank"),
    )


def quantization_of(config: Mapping[str, Any], model_type: str) -> Quantization | None:
    """quantization_config's method and weight bits: fp8, awq 4-bit and gptq 4/8-bit; any other is refused."""
    quant = config.get("quantization_config")
    text = config.get("text_config")
    if quant is None and isinstance(text, Mapping):
        quant = text.get("quantization_config")
    if quant is None:
        return None
    if not isinstance(quant, Mapping) or not quant.get("quant_method"):
        raise ShapeError(
            f"unknown quantisation: model_type {model_type} has a quantization_config with no quant_method"
        )
    method = str(quant["quant_method"]).lower()
    if method not in QUANT_BITS:
        raise ShapeError(
            f"unknown quantisation: model_type {model_type} declares quant_method {method}, which the planner "
            f"cannot size (it sizes {', '.join(sorted(QUANT_BITS))})"
        )
    if method == "fp8":
        block = quant.get("weight_block_size")
        detail = f"block {'x'.join(map(str, block))}" if block else "per tensor"
        activation = quant.get("activation_scheme")
        return Quantization(method, 8, f"{detail}, {activation} activations" if activation else detail)
    bits = quant.get("bits", quant.get("w_bit"))
    if bits not in QUANT_BITS[method]:
        raise ShapeError(
            f"unknown quantisation: model_type {model_type} declares {method} with bits = {bits!r}, which the "
            f"planner cannot size ({method}: {', '.join(map(str, QUANT_BITS[method]))}-bit)"
        )
    group = quant.get("group_size", quant.get("q_group_size"))
    return Quantization(method, int(bits), f"group {group}" if group else "")


def has_vision_tower(config: Mapping[str, Any], weight_names: Iterable[str] = ()) -> bool:
    """A vision tower is present when config.json describes one or the checkpoint holds its weights."""
    if isinstance(config.get("vision_config"), Mapping) and config["vision_config"]:
        return True
    return any(name.startswith(VISION_PREFIXES) for name in weight_names)


def shape_from_config(
    config: Mapping[str, Any], weights: Weights | None = None, weight_names: Iterable[str] = ()
) -> ModelShape:
    """The ModelShape of a config.json (as a dict), with the checkpoint's weights when known."""
    model_type, text_type, text = text_config_of(config)
    family = FAMILIES[text_type]
    layers = _positive(text, text_type, "num_hidden_layers")
    heads = _positive(text, text_type, "num_attention_heads")
    hidden = _positive(text, text_type, "hidden_size")
    mla = mla_of(text, text_type, family)
    # MLA caches one latent per token whatever the heads; the config's KV head count is kept for the record.
    if mla is not None:
        kv_heads = text.get("num_key_value_heads") or heads
    else:
        kv_heads = _positive(text, text_type, "num_key_value_heads")
    if mla is None and heads % kv_heads:
        raise _unknown(text_type, f"has {heads} attention heads, not a multiple of its {kv_heads} KV heads")
    if mla is not None:
        head_size = mla.qk_nope_head_dim + mla.qk_rope_head_dim
    else:
        head_size = _head_size(text, text_type, family, heads, hidden)
    tie = text.get("tie_word_embeddings", config.get("tie_word_embeddings"))
    if tie is None:
        # Gemma ties its embeddings by definition (its configs omit the key); the others must say.
        tie = family in GEMMA_FAMILIES or _field(text, text_type, "tie_word_embeddings")
    architectures = config.get("architectures") or []
    return ModelShape(
        model_type=model_type,
        text_model_type=text_type,
        architecture=str(architectures[0]) if architectures else "",
        dtype=_dtype(config, text, text_type),
        num_layers=layers,
        hidden_size=hidden,
        num_attention_heads=heads,
        num_kv_heads=kv_heads,
        head_size=head_size,
        intermediate_size=text.get("intermediate_size"),
        vocab_size=_positive(text, text_type, "vocab_size"),
        max_position_embeddings=_positive(text, text_type, "max_position_embeddings"),
        tie_word_embeddings=bool(tie),
        layer_windows=layer_windows_of(text, text_type, family, layers),
        moe=moe_of(text, text_type, family, layers),
        mla=mla,
        quantization=quantization_of(config, text_type),
        has_vision_tower=has_vision_tower(config, weight_names),
        weights=weights,
    )


def weights_from_index(index: Mapping[str, Any]) -> Weights:
    """The total parameter bytes model.safetensors.index.json declares (metadata.total_size)."""
    metadata = index.get("metadata")
    total = metadata.get("total_size") if isinstance(metadata, Mapping) else None
    if isinstance(total, bool) or not isinstance(total, int) or total <= 0:
        raise ShapeError("unknown weights: model.safetensors.index.json has no metadata.total_size")
    return Weights(total_bytes=total, source="model.safetensors.index.json")


def read_safetensors_header(path: str) -> dict[str, Any]:
    """The JSON header of a .safetensors file; only its first 8 + N bytes are read, never the tensors."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise ShapeError(f"unknown weights: {path} is shorter than a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > MAX_HEADER_BYTES:
            raise ShapeError(f"unknown weights: {path} declares a {length}-byte header (more than safetensors allows)")
        raw = handle.read(length)
    if len(raw) != length:
        raise ShapeError(f"unknown weights: {path} ends inside its {length}-byte header")
    try:
        header = json.loads(raw)
    except ValueError as error:
        raise ShapeError(f"unknown weights: the header of {path} is not JSON ({error})") from error
    if not isinstance(header, dict):
        raise ShapeError(f"unknown weights: the header of {path} is not a JSON object")
    return header


def _tensor_bytes(name: str, tensor: Any) -> tuple[str, int]:
    if not isinstance(tensor, Mapping) or not isinstance(tensor.get("shape"), list):
        raise ShapeError(f"unknown weights: tensor {name} has no dtype and shape")
    dtype = str(tensor.get("dtype"))
    if dtype not in SAFETENSORS_DTYPE_BYTES:
        raise ShapeError(f"unknown weights: tensor {name} has dtype {dtype}, which the planner cannot size")
    count = 1
    for dim in tensor["shape"]:
        count *= int(dim)
    return dtype, count * SAFETENSORS_DTYPE_BYTES[dtype]


def weights_from_headers(headers: Iterable[Mapping[str, Any]], source: str = "safetensors headers") -> Weights:
    """Parameter bytes in total and per dtype, summed over the tensors of safetensors headers."""
    by_dtype: dict[str, int] = {}
    for header in headers:
        for name, tensor in header.items():
            if name == "__metadata__":
                continue
            dtype, size = _tensor_bytes(name, tensor)
            by_dtype[dtype] = by_dtype.get(dtype, 0) + size
    if not by_dtype:
        raise ShapeError("unknown weights: the safetensors headers hold no tensors")
    return Weights(sum(by_dtype.values()), tuple(sorted(by_dtype.items())), source)


def weight_names_of(index: Mapping[str, Any]) -> list[str]:
    weight_map = index.get("weight_map")
    return list(weight_map) if isinstance(weight_map, Mapping) else []


def _read_json(path: str) -> Any:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except ValueError as error:
        raise ShapeError(f"unknown shape: {path} is not JSON ({error})") from error


def _weights_of_dir(path: str) -> tuple[Weights, list[str]]:
    index_path = os.path.join(path, "model.safetensors.index.json")
    if os.path.isfile(index_path):
        index = _read_json(index_path)
        if not isinstance(index, Mapping):
            raise ShapeError(f"unknown weights: {index_path} is not a JSON object")
        weights = weights_from_index(index)
        names = weight_names_of(index)
        shards = sorted(set(index["weight_map"].values())) if names else []
        shard_paths = [os.path.join(path, shard) for shard in shards]
        if shard_paths and all(os.path.isfile(shard) for shard in shard_paths):
            # The shards are staged: their headers give the bytes per dtype, and must add up to the index.
            counted = weights_from_headers(read_safetensors_header(shard) for shard in shard_paths)
            if counted.total_bytes != weights.total_bytes:
                raise ShapeError(
                    f"unknown weights: {index_path} declares {weights.total_bytes:,} bytes but the headers of its "
                    f"{len(shards)} shards hold {counted.total_bytes:,}"
                )
            weights = Weights(weights.total_bytes, counted.by_dtype, "model.safetensors.index.json and headers")
        return weights, names
    files = sorted(name for name in os.listdir(path) if name.endswith(".safetensors"))
    if not files:
        raise ShapeError(f"unknown weights: {path} has no model.safetensors.index.json and no *.safetensors file")
    headers = [read_safetensors_header(os.path.join(path, name)) for name in files]
    names = [name for header in headers for name in header if name != "__metadata__"]
    return weights_from_headers(headers, f"safetensors headers ({len(files)} files)"), names


def merged(base: Mapping[str, Any], overrides: Mapping[str, Any]) -> dict[str, Any]:
    """config.json with overrides merged in, recursively (model_store's combine(recursive=True))."""
    result = dict(base)
    for key, value in overrides.items():
        if isinstance(value, Mapping) and isinstance(result.get(key), Mapping):
            result[key] = merged(result[key], value)
        else:
            result[key] = value
    return result


def read_model_dir(path: str, config_overrides: Mapping[str, Any] | None = None) -> ModelShape:
    """The ModelShape of a model directory (staged, or the small files of its repository): config.json, with the
    overrides model_store merges into it, plus the index or the safetensors headers."""
    config_path = os.path.join(path, "config.json")
    if not os.path.isfile(config_path):
        raise ShapeError(f"unknown shape: {path} has no config.json")
    config = _read_json(config_path)
    if not isinstance(config, Mapping):
        raise ShapeError(f"unknown shape: {config_path} is not a JSON object")
    weights, names = _weights_of_dir(path)
    return shape_from_config(merged(config, config_overrides or {}), weights, names)
