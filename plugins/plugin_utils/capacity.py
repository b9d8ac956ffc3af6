# -*- coding: utf-8 -*-
"""Will it fit? vLLM's KV-cache budget for one instance, predicted from a ModelShape before any host is touched
(issue 34). Controller-only (plugin_utils); standard library only.

It follows vLLM's V1 engine (0.10 to 0.2x), step by step:

1. Memory for the KV cache, per GPU (vllm/v1/worker/gpu_worker.py, Worker.determine_available_memory):
   requested = total GPU memory x gpu_memory_utilization, minus non_kv_cache_memory, which
   vllm/utils/mem_utils.py memory_profiling measures around one profile_run: the weights, the torch peak
   increase (the activations of one forward of max_num_batched_tokens tokens and the sampler's dummy run over
   max_num_seqs rows) and the non-torch increase (cuBLAS and attention workspaces; NCCL's buffers are allocated
   before the baseline snapshot and are not counted). Since v0.21 (VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS=1 by
   default, PR 30515 added it off by default) the V1 model runner's CUDA-graph estimate is subtracted too; vLLM
   0.26.0's V2 model runner did not (tests/fixtures/h200-real/vllm_serve.log), hence
   InstanceSettings.cudagraph_memory_profiled. vLLM measures the three overheads; this module estimates them
   (ACTIVATION_*, NON_TORCH_BYTES, CUDAGRAPH_BYTES below, with where each comes from) and takes measured values
   instead when the settings carry them. They are explicit fields of the Prediction.
2. KV bytes per layer and block (vllm/v1/kv_cache_interface.py): AttentionSpec.page_size_bytes =
   2 x block_size x num_kv_heads x head_size x dtype bytes, for FullAttentionSpec and SlidingWindowSpec, the
   KV heads split across TP but never below one per GPU (vllm/model_executor/models/llama.py:
   num_kv_heads = max(1, total_num_kv_heads // tp_size), replicated when there are fewer KV heads than GPUs);
   MLAAttentionSpec: block_size x 1 x (kv_lora_rank + qk_rope_head_dim) x dtype bytes, no factor 2, the same on
   every TP rank.
3. What one request at max_model_len holds (max_memory_usage_bytes): FullAttentionSpec
   cdiv(max_model_len, block_size) pages; SlidingWindowSpec cdiv(min(sliding_window - 1 +
   max_num_batched_tokens, max_model_len), block_size) + 1 pages.
4. KV cache groups (vllm/v1/core/kv_cache_utils.py get_kv_cache_groups): one group when every layer has the
   same spec; otherwise (hybrid: Gemma 2/3's local and global layers) _get_kv_cache_groups_uniform_page_size:
   the group size is the fewest layers of one type (the most, when that is under 1.5 x the fewest), each type
   is split into cdiv(layers, group size) groups. With the hybrid manager disabled, sliding layers count as full
   (unify_hybrid_kv_cache_specs).
5. Blocks and what vLLM reports (get_kv_cache_config_from_groups, get_num_blocks, get_kv_cache_configs,
   _report_kv_cache_config, get_max_concurrency_for_kv_cache_config): num_blocks = available // page_size //
   group size, the smallest over the pipeline stages; "GPU KV cache size: num_blocks // groups x block_size
   tokens"; "Maximum concurrency for max_model_len tokens per request: num_blocks / cdiv(sum of the groups'
   max memory, page_size)".
6. The refusal (_check_enough_kv_cache_memory, _max_memory_usage_bytes_from_groups,
   _estimate_max_model_len_from_groups): no memory left, or one request at max_model_len needs group size x
   page_size x the blocks it takes in every group, more than is available; vLLM then names the largest
   max_model_len that would fit, found by binary search.

vLLM's CPU backend skips step 1: its worker returns VLLM_CPU_KVCACHE_SPACE GiB as the available memory
(vllm/v1/worker/cpu_worker.py), which predict_fixed_space takes as it is.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.model_shape import ModelShape

GiB = 1 << 30
MiB = 1 << 20

# The activation peak vLLM's profile_run leaves in torch's allocator (an estimate: vLLM measures it). Its forward
# keeps, per token, about four hidden-size tensors (residual, normed input, attention and MLP outputs), the q/k/v
# projections and the MLP's gate/up and activation outputs (for MoE those of each selected expert); the sampler's
# dummy run holds float32 logits of max_num_seqs x vocab. The peak is the larger of the two, plus
# ACTIVATION_BASE_BYTES of buffers the runner allocates alongside. Checked against vLLM 0.26.0 on the project's H200
# (tests/fixtures/h200-real/vllm_serve.log: "0.27 GiB for peak activation", a 4-layer hidden-1024 Qwen2 at
# max_num_batched_tokens 8192; this gives 0.28 GiB); for Llama-3.1-8B at 8192 tokens it gives 1.06 GiB, where a
# published walk-through of vLLM's log quotes a torch peak increase of 1.21 GiB.
ACTIVATION_HIDDEN_TENSORS = 4
ACTIVATION_BASE_BYTES = 64 * MiB
SAMPLER_LOGIT_BYTES = 4
# The non-torch increase: 0.22 GiB on the H200 capture above; rounded up.
NON_TORCH_BYTES = 256 * MiB
# vLLM's CUDA-graph estimate ("Estimated CUDA graph memory: X GiB total"): 0.23 GiB captured for the 4-layer
# model above, 0.36 to 0.84 GiB estimated for 8B to 30B models in vLLM's published logs; half a GiB here.
CUDAGRAPH_BYTES = 512 * MiB
# Block sizes vLLM picks when none is given: 16 (CacheConfig), 64 for MLA (FlashMLA's, vllm/platforms/cuda.py).
DEFAULT_BLOCK_SIZE = 16
MLA_BLOCK_SIZE = 64
# vllm/engine/arg_utils.py get_batch_defaults for `vllm serve` (OPENAI_API_SERVER): 8192 tokens and 1024
# sequences on a GPU of 70 GiB or more that is not an A100, else 2048 and 256; the CPU backend: 2048 tokens.
LARGE_GPU_BYTES = 70 * GiB
LARGE_GPU_BATCH = (8192, 1024)
SMALL_GPU_BATCH = (2048, 256)
CPU_MAX_NUM_BATCHED_TOKENS = 2048
KV_CACHE_DTYPE_BYTES = {"fp8": 1, "fp8_e4m3": 1, "fp8_e5m2": 1, "bfloat16": 2, "float16": 2, "half": 2}
# fits(): the highest utilisation suggested (vLLM's startup check needs the rest free for the CUDA context).
MAX_SUGGESTED_UTILIZATION = 0.95
MAX_TENSOR_PARALLEL_SIZE = 8


class CapacityError(ValueError):
    """Settings vLLM would refuse, or a shape the planner cannot size (no weights): the message says which."""


@dataclass(frozen=True)
class InstanceSettings:
    """One vLLM instance as declared: what vLLM's engine arguments of the same names set."""

    gpu_memory_bytes: int  # per GPU, as cudaMemGetInfo reports its total (what vLLM multiplies)
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None  # None: the model's max_position_embeddings
    gpu_memory_utilization: float = 0.9
    kv_cache_dtype: str = "auto"
    block_size: int | None = None  # None: 16, or 64 for MLA
    max_num_batched_tokens: int | None = None  # None: vLLM's default for the GPU (default_batch_limits)
    max_num_seqs: int | None = None
    gpu_name: str = ""  # only for vLLM's A100 exception to the batch defaults
    enforce_eager: bool = False  # no CUDA graphs
    cudagraph_memory_profiled: bool = True  # vLLM >= 0.21's V1 runner subtracts its CUDA-graph estimate
    hybrid_kv_cache_manager: bool = True  # False: --disable-hybrid-kv-cache-manager
    # Measured overheads (from a vLLM log of the same model and settings) replace the estimates.
    activation_peak_bytes: int | None = None
    non_torch_bytes: int | None = None
    cudagraph_bytes: int | None = None


@dataclass(frozen=True)
class LayerKV:
    """The KV cache of one layer on one GPU."""

    kind: str  # "full_attention", "sliding_attention" or "mla"
    window: int | None
    page_size_bytes: int  # one block of block_size tokens
    block_size: int

    @property
    def bytes_per_token(self) -> int:
        return self.page_size_bytes // self.block_size

    def max_memory_usage_bytes(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """What one request at max_model_len holds in this layer (FullAttentionSpec / SlidingWindowSpec)."""
        if self.kind == "sliding_attention" and self.window is not None:
            tokens = min(self.window - 1 + max_num_batched_tokens, max_model_len)
            return (math.ceil(tokens / self.block_size) + 1) * self.page_size_bytes
        return math.ceil(max_model_len / self.block_size) * self.page_size_bytes


@dataclass(frozen=True)
class KVGroups:
    """vLLM's KV cache groups: the layers (by index) that share a block table, and the spec of each group."""

    groups: tuple[tuple[int, ...], ...]
    specs: tuple[LayerKV, ...]

    @property
    def page_size_bytes(self) -> int:
        return self.specs[0].page_size_bytes

    @property
    def group_size(self) -> int:
        return max(len(group) for group in self.groups)

    def blocks_per_request(self, max_model_len: int, max_num_batched_tokens: int) -> int:
        """cdiv of every group's max memory by the page size, summed (get_max_concurrency_for_kv_cache_config)."""
        return sum(
            math.ceil(spec.max_memory_usage_bytes(max_model_len, max_num_batched_tokens) / self.page_size_bytes)
            for spec in self.specs
        )

    def group_size_on(self, layers: range) -> int:
        """The group size a pipeline stage holding these layers sees (_project_kv_cache_groups_to_worker)."""
        return max(sum(1 for layer in group if layer in layers) for group in self.groups)


@dataclass(frozen=True)
class KVCapacity:
    """The KV cache vLLM would allocate, and the two lines it logs about it."""

    num_blocks: int
    block_size: int
    num_groups: int
    tokens: int
    max_model_len: int
    max_concurrency: float
    blocks_per_request: int
    available_bytes: int  # on the stage with the least room for its KV cache
    bytes_needed_per_request: int  # one request at max_model_len, on that stage

    @property
    def fits_one_request(self) -> bool:
        return 0 < self.bytes_needed_per_request <= self.available_bytes

    def log_lines(self) -> tuple[str, str]:
        return (
            f"GPU KV cache size: {self.tokens:,} tokens",
            f"Maximum concurrency for {self.max_model_len:,} tokens per request: {self.max_concurrency:.2f}x",
        )


@dataclass(frozen=True)
class Prediction:
    settings: InstanceSettings
    max_model_len: int
    kv_cache_dtype_bytes: int
    block_size: int
    max_num_batched_tokens: int
    max_num_seqs: int
    requested_bytes: int  # gpu_memory_bytes x gpu_memory_utilization
    weights_bytes_per_gpu: int
    activation_peak_bytes: int
    non_torch_bytes: int
    cudagraph_bytes: int
    kv_cache_bytes: int  # left for the KV cache on the GPU with the least (vLLM's "Available KV cache memory")
    kv_bytes_per_token: tuple[tuple[str, int], ...]  # per layer kind, one GPU, every layer of a stage
    capacity: KVCapacity

    @property
    def overhead_bytes(self) -> int:
        return self.activation_peak_bytes + self.non_torch_bytes + self.cudagraph_bytes

    def summary(self) -> str:
        tokens, concurrency = self.capacity.log_lines()
        return (
            f"weights {gib(self.weights_bytes_per_gpu)} + activations {gib(self.activation_peak_bytes)} + "
            f"non-torch {gib(self.non_torch_bytes)} + CUDA graphs {gib(self.cudagraph_bytes)} per GPU of "
            f"{gib(self.requested_bytes)} requested; KV cache {gib(self.kv_cache_bytes)}; {tokens}; {concurrency}"
        )


@dataclass(frozen=True)
class Fix:
    setting: str  # the InstanceSettings field to change
    value: int | float | str
    text: str


@dataclass(frozen=True)
class Verdict:
    fits: bool
    prediction: Prediction
    problem: str = ""  # the number that does not fit
    fixes: tuple[Fix, ...] = ()  # each alone makes it fit, the smallest first

    @property
    def fix(self) -> Fix | None:
        return self.fixes[0] if self.fixes else None

    def message(self) -> str:
        if self.fits:
            return "fits: " + self.prediction.summary()
        if not self.fixes:
            return (
                f"does not fit: {self.problem}; no single change of TP size, max_model_len, KV cache dtype or "
                "utilisation fixes it"
            )
        return f"does not fit: {self.problem}; fix: " + ", or ".join(fix.text for fix in self.fixes)


def gib(value: int) -> str:
    return f"{value / GiB:.2f} GiB"


def default_batch_limits(gpu_memory_bytes: int, gpu_name: str = "") -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) `vllm serve` picks for a GPU (arg_utils.py get_batch_defaults)."""
    if gpu_memory_bytes >= LARGE_GPU_BYTES and "a100" not in gpu_name.lower():
        return LARGE_GPU_BATCH
    return SMALL_GPU_BATCH


def default_block_size(shape: ModelShape) -> int:
    return MLA_BLOCK_SIZE if shape.mla is not None else DEFAULT_BLOCK_SIZE


def kv_dtype_bytes(shape: ModelShape, kv_cache_dtype: str = "auto") -> int:
    """Bytes per cached element: 'auto' is the model's dtype, fp8 (e4m3 or e5m2) one byte."""
    if kv_cache_dtype == "auto":
        return shape.dtype_bytes
    if kv_cache_dtype not in KV_CACHE_DTYPE_BYTES:
        raise CapacityError(
            f"kv_cache_dtype {kv_cache_dtype!r} cannot be sized (auto, {', '.join(sorted(KV_CACHE_DTYPE_BYTES))})"
        )
    return KV_CACHE_DTYPE_BYTES[kv_cache_dtype]


def kv_heads_per_gpu(shape: ModelShape, tensor_parallel_size: int = 1) -> int:
    """KV heads one TP rank caches: split across ranks, replicated when there are fewer heads than ranks."""
    if shape.mla is not None:
        return 1
    return max(1, shape.num_kv_heads // tensor_parallel_size)


def layer_kv(
    shape: ModelShape,
    kv_cache_dtype: str = "auto",
    tensor_parallel_size: int = 1,
    block_size: int | None = None,
    hybrid_kv_cache_manager: bool = True,
) -> tuple[LayerKV, ...]:
    """The KV cache spec of every layer on one GPU (page_size_bytes as kv_cache_interface.py computes it)."""
    block = block_size or default_block_size(shape)
    dtype_bytes = kv_dtype_bytes(shape, kv_cache_dtype)
    if shape.mla is not None:
        page = block * shape.mla.cache_width * dtype_bytes
        return (LayerKV("mla", None, page, block),) * shape.num_layers
    page = 2 * block * kv_heads_per_gpu(shape, tensor_parallel_size) * shape.head_size * dtype_bytes
    specs = []
    for window in shape.layer_windows:
        if window is None or not hybrid_kv_cache_manager:
            specs.append(LayerKV("full_attention", None, page, block))
        else:
            specs.append(LayerKV("sliding_attention", window, page, block))
    return tuple(specs)


def kv_bytes_per_token(
    shape: ModelShape, kv_cache_dtype: str = "auto", tensor_parallel_size: int = 1
) -> dict[str, int]:
    """KV bytes one token takes on one GPU, per layer kind, summed over the model's layers (PP 1)."""
    totals: dict[str, int] = {}
    for spec in layer_kv(shape, kv_cache_dtype, tensor_parallel_size, block_size=1):
        totals[spec.kind] = totals.get(spec.kind, 0) + spec.bytes_per_token
    return totals


def kv_groups(layers: Sequence[LayerKV]) -> KVGroups:
    """vLLM's KV cache groups for these layer specs (get_kv_cache_groups)."""
    if len(set(layers)) == 1:
        return KVGroups((tuple(range(len(layers))),), (layers[0],))
    if len({spec.page_size_bytes for spec in layers}) != 1:
        raise CapacityError("layers with different KV page sizes: vLLM would unify them, the planner cannot")
    same_type: dict[LayerKV, list[int]] = {}
    for index, spec in enumerate(layers):
        same_type.setdefault(spec, []).append(index)
    fewest = min(len(indices) for indices in same_type.values())
    most = max(len(indices) for indices in same_type.values())
    group_size = most if most < fewest * 1.5 else fewest
    groups: list[tuple[int, ...]] = []
    specs: list[LayerKV] = []
    for spec, indices in same_type.items():
        count = math.ceil(len(indices) / group_size)
        for start in range(count):
            groups.append(tuple(indices[start::count]))
            specs.append(spec)
    return KVGroups(tuple(groups), tuple(specs))


def stage_layer_counts(num_layers: int, pipeline_parallel_size: int) -> list[int]:
    """Layers per pipeline stage (vllm/distributed/utils.py get_pp_indices: the remainder goes to the stages
    before the last)."""
    counts = [num_layers // pipeline_parallel_size] * pipeline_parallel_size
    for offset in range(2, num_layers % pipeline_parallel_size + 2):
        counts[-offset] += 1
    return counts


def stage_ranges(num_layers: int, pipeline_parallel_size: int) -> list[range]:
    ranges, start = [], 0
    for count in stage_layer_counts(num_layers, pipeline_parallel_size):
        ranges.append(range(start, start + count))
        start += count
    return ranges


def weight_bytes_per_parameter(shape: ModelShape) -> float:
    if shape.quantization is not None:
        return shape.quantization.weight_bits / 8
    return shape.dtype_bytes


def stage_weights_bytes(shape: ModelShape, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> list[int]:
    """Weights one GPU of each pipeline stage holds. The checkpoint's bytes (a float32 one served in 16 bits)
    split over TP; with PP the embedding goes to the first stage, the LM head (a copy, when tied) to the last, the
    rest by layer. K/V projections replicated when there are fewer KV heads than TP ranks add their copies."""
    if shape.weights is None:
        raise CapacityError(
            f"no weights for {shape.architecture or shape.model_type}: stage model.safetensors.index.json or the "
            "safetensors files beside config.json"
        )
    total = shape.weights.total_bytes
    if shape.dtype == "float32":
        total = total * shape.dtype_bytes // 4
    embedding = shape.vocab_size * shape.hidden_size * shape.dtype_bytes
    head = 0 if shape.tie_word_embeddings else embedding
    if pipeline_parallel_size == 1:
        stages = [total]
    else:
        body = total - embedding - head
        if body <= 0:
            raise CapacityError(f"the checkpoint's {total:,} bytes are less than its embeddings: not a full checkpoint")
        counts = stage_layer_counts(shape.num_layers, pipeline_parallel_size)
        stages = [body * count // shape.num_layers for count in counts]
        stages[0] += embedding
        stages[-1] += embedding if shape.tie_word_embeddings else head
    per_gpu = [math.ceil(stage / tensor_parallel_size) for stage in stages]
    if shape.mla is None and shape.num_kv_heads < tensor_parallel_size:
        kv_projection = 2 * shape.hidden_size * shape.head_size * weight_bytes_per_parameter(shape)
        extra = kv_projection * (1 - shape.num_kv_heads / tensor_parallel_size)
        counts = stage_layer_counts(shape.num_layers, pipeline_parallel_size)
        per_gpu = [size + int(extra * count) for size, count in zip(per_gpu, counts, strict=True)]
    return per_gpu


def weights_bytes_per_gpu(shape: ModelShape, tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1) -> int:
    """The weights of the fullest GPU at this TP/PP."""
    return max(stage_weights_bytes(shape, tensor_parallel_size, pipeline_parallel_size))


def _ffn_width(shape: ModelShape, tensor_parallel_size: int) -> int:
    """Per-token MLP intermediates one GPU holds: gate/up and activation outputs (x3); for MoE the routed experts'
    (per selected expert, plus its output before the weighted sum) and the shared experts'."""
    dense = 3 * (shape.intermediate_size or 0) // tensor_parallel_size
    if shape.moe is None:
        return dense
    moe = shape.moe
    routed = moe.experts_per_token * (3 * moe.expert_intermediate_size // tensor_parallel_size + shape.hidden_size)
    shared = 3 * moe.shared_intermediate_size // tensor_parallel_size
    return max(routed + shared, dense if moe.moe_layers < shape.num_layers else 0)


def _attention_width(shape: ModelShape, tensor_parallel_size: int) -> int:
    heads = shape.num_attention_heads // tensor_parallel_size
    if shape.mla is not None:
        mla = shape.mla
        return (
            heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim)
            + mla.cache_width
            + heads * (mla.qk_nope_head_dim + mla.v_head_dim)
        )
    return (heads + 2 * kv_heads_per_gpu(shape, tensor_parallel_size)) * shape.head_size


def estimate_activation_peak(
    shape: ModelShape, max_num_batched_tokens: int, max_num_seqs: int, tensor_parallel_size: int = 1
) -> int:
    """The torch peak increase of vLLM's profile_run, estimated (see ACTIVATION_* above)."""
    width = (
        ACTIVATION_HIDDEN_TENSORS * shape.hidden_size
        + _attention_width(shape, tensor_parallel_size)
        + _ffn_width(shape, tensor_parallel_size)
    )
    forward = max_num_batched_tokens * width * shape.dtype_bytes
    sampler = max_num_seqs * shape.vocab_size * SAMPLER_LOGIT_BYTES
    hidden_states = max_num_batched_tokens * shape.hidden_size * shape.dtype_bytes
    return max(forward, sampler + hidden_states) + ACTIVATION_BASE_BYTES


def _check(shape: ModelShape, settings: InstanceSettings) -> None:
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    if settings.gpu_memory_bytes <= 0:
        raise CapacityError("gpu_memory_bytes must be positive")
    if not 0 < settings.gpu_memory_utilization <= 1:
        raise CapacityError(f"gpu_memory_utilization {settings.gpu_memory_utilization} is not in (0, 1]")
    if tp < 1 or pp < 1:
        raise CapacityError("tensor_parallel_size and pipeline_parallel_size must be at least 1")
    if shape.num_attention_heads % tp:
        raise CapacityError(
            f"{shape.num_attention_heads} attention heads are not divisible by tensor_parallel_size {tp} "
            "(vLLM refuses it)"
        )
    if shape.mla is None and shape.num_kv_heads % tp and tp % shape.num_kv_heads:
        raise CapacityError(
            f"{shape.num_kv_heads} KV heads can be neither split nor replicated over tensor_parallel_size {tp}"
        )
    if pp > shape.num_layers:
        raise CapacityError(f"pipeline_parallel_size {pp} exceeds the model's {shape.num_layers} layers")
    if settings.max_model_len is not None and settings.max_model_len < 1:
        raise CapacityError("max_model_len must be at least 1")


def _capacity(
    groups: KVGroups,
    stages: Sequence[range],
    available: Sequence[int],
    max_model_len: int,
    max_num_batched_tokens: int,
) -> KVCapacity:
    page = groups.page_size_bytes
    sizes = [groups.group_size_on(layers) for layers in stages]
    num_blocks = min(max(0, room // page // size) for room, size in zip(available, sizes, strict=True))
    per_request = groups.blocks_per_request(max_model_len, max_num_batched_tokens)
    needed = [size * page * per_request for size in sizes]
    worst = max(range(len(stages)), key=lambda stage: needed[stage] - available[stage])
    block_size = groups.specs[0].block_size
    return KVCapacity(
        num_blocks=num_blocks,
        block_size=block_size,
        num_groups=len(groups.groups),
        tokens=num_blocks // len(groups.groups) * block_size,
        max_model_len=max_model_len,
        max_concurrency=num_blocks / per_request,
        blocks_per_request=per_request,
        available_bytes=available[worst],
        bytes_needed_per_request=needed[worst],
    )


def largest_max_model_len(
    groups: KVGroups, stages: Sequence[range], available: Sequence[int], limit: int, max_num_batched_tokens: int
) -> int:
    """The largest max_model_len up to limit whose one request fits every stage (vLLM's binary search); 0: none."""

    def fits_in_memory(length: int) -> bool:
        per_request = groups.blocks_per_request(length, max_num_batched_tokens)
        return all(
            groups.group_size_on(layers) * groups.page_size_bytes * per_request <= room
            for layers, room in zip(stages, available, strict=True)
        )

    if limit < 1 or not fits_in_memory(1):
        return 0
    low, high, best = 1, limit, 1
    while low <= high:
        middle = (low + high) // 2
        if fits_in_memory(middle):
            best, low = middle, middle + 1
        else:
            high = middle - 1
    return best


def predict_fixed_space(
    shape: ModelShape,
    kv_space_bytes: int,
    *,
    max_model_len: int | None = None,
    kv_cache_dtype: str = "auto",
    block_size: int | None = None,
    tensor_parallel_size: int = 1,
    pipeline_parallel_size: int = 1,
    max_num_batched_tokens: int = CPU_MAX_NUM_BATCHED_TOKENS,
    hybrid_kv_cache_manager: bool = True,
) -> KVCapacity:
    """The KV cache vLLM allocates from a fixed space per worker (the CPU backend's VLLM_CPU_KVCACHE_SPACE GiB,
    or --kv-cache-memory-bytes), with its block rounding: the tokens and concurrency it logs."""
    layers = layer_kv(shape, kv_cache_dtype, tensor_parallel_size, block_size, hybrid_kv_cache_manager)
    stages = stage_ranges(shape.num_layers, pipeline_parallel_size)
    length = max_model_len or shape.max_position_embeddings
    return _capacity(kv_groups(layers), stages, [kv_space_bytes] * len(stages), length, max_num_batched_tokens)


def predict(shape: ModelShape, settings: InstanceSettings) -> Prediction:
    """What vLLM would budget for this instance on these GPUs: the overheads, the KV cache and its capacity."""
    _check(shape, settings)
    tp, pp = settings.tensor_parallel_size, settings.pipeline_parallel_size
    default_tokens, default_seqs = default_batch_limits(settings.gpu_memory_bytes, settings.gpu_name)
    batched_tokens = settings.max_num_batched_tokens or default_tokens
    num_seqs = min(settings.max_num_seqs or default_seqs, batched_tokens)
    max_model_len = settings.max_model_len or shape.max_position_embeddings
    activation = settings.activation_peak_bytes
    if activation is None:
        activation = estimate_activation_peak(shape, batched_tokens, num_seqs, tp)
    non_torch = NON_TORCH_BYTES if settings.non_torch_bytes is None else settings.non_torch_bytes
    cudagraph = 0
    if not settings.enforce_eager and settings.cudagraph_memory_profiled:
        cudagraph = CUDAGRAPH_BYTES if settings.cudagraph_bytes is None else settings.cudagraph_bytes
    requested = int(settings.gpu_memory_bytes * settings.gpu_memory_utilization)
    stage_weights = stage_weights_bytes(shape, tp, pp)
    available = [requested - weights - activation - non_torch - cudagraph for weights in stage_weights]
    layers = layer_kv(shape, settings.kv_cache_dtype, tp, settings.block_size, settings.hybrid_kv_cache_manager)
    stages = stage_ranges(shape.num_layers, pp)
    capacity = _capacity(kv_groups(layers), stages, available, max_model_len, batched_tokens)
    fullest = max(stages, key=len)
    per_token: dict[str, int] = {}
    for index in fullest:
        per_token[layers[index].kind] = per_token.get(layers[index].kind, 0) + layers[index].bytes_per_token
    return Prediction(
        settings=settings,
        max_model_len=max_model_len,
        kv_cache_dtype_bytes=kv_dtype_bytes(shape, settings.kv_cache_dtype),
        block_size=layers[0].block_size,
        max_num_batched_tokens=batched_tokens,
        max_num_seqs=num_seqs,
        requested_bytes=requested,
        weights_bytes_per_gpu=max(stage_weights),
        activation_peak_bytes=activation,
        non_torch_bytes=non_torch,
        cudagraph_bytes=cudagraph,
        kv_cache_bytes=min(available),
        kv_bytes_per_token=tuple(sorted(per_token.items())),
        capacity=capacity,
    )


def _fits(prediction: Prediction) -> bool:
    return prediction.kv_cache_bytes > 0 and prediction.capacity.fits_one_request


def _problem(shape: ModelShape, prediction: Prediction) -> str:
    settings = prediction.settings
    if prediction.kv_cache_bytes <= 0:
        used = prediction.weights_bytes_per_gpu + prediction.overhead_bytes
        return (
            f"weights {gib(prediction.weights_bytes_per_gpu)} + activations {gib(prediction.activation_peak_bytes)} "
            f"+ non-torch {gib(prediction.non_torch_bytes)} + CUDA graphs {gib(prediction.cudagraph_bytes)} = "
            f"{gib(used)} per GPU exceed the {gib(prediction.requested_bytes)} vLLM may use "
            f"({settings.gpu_memory_utilization} x {gib(settings.gpu_memory_bytes)}) at tensor_parallel_size "
            f"{settings.tensor_parallel_size}"
        )
    capacity = prediction.capacity
    return (
        f"one request of max_model_len {capacity.max_model_len:,} tokens needs "
        f"{gib(capacity.bytes_needed_per_request)} of KV cache per GPU, {gib(capacity.available_bytes)} is left for it "
        f"({shape.architecture or shape.model_type} at tensor_parallel_size {settings.tensor_parallel_size})"
    )


def _utilization_fix(shape: ModelShape, settings: InstanceSettings) -> Fix | None:
    step = math.floor(settings.gpu_memory_utilization * 100) + 1
    while step <= round(MAX_SUGGESTED_UTILIZATION * 100):
        utilization = step / 100
        if _fits(predict(shape, dataclasses.replace(settings, gpu_memory_utilization=utilization))):
            return Fix("gpu_memory_utilization", utilization, f"gpu_memory_utilization {utilization:.2f}")
        step += 1
    return None


def _kv_dtype_fix(shape: ModelShape, settings: InstanceSettings) -> Fix | None:
    if kv_dtype_bytes(shape, settings.kv_cache_dtype) <= 1:
        return None
    if _fits(predict(shape, dataclasses.replace(settings, kv_cache_dtype="fp8"))):
        return Fix("kv_cache_dtype", "fp8", "kv_cache_dtype fp8")
    return None


def _max_model_len_fix(shape: ModelShape, prediction: Prediction) -> Fix | None:
    settings = prediction.settings
    if prediction.kv_cache_bytes <= 0:
        return None
    layers = layer_kv(
        shape,
        settings.kv_cache_dtype,
        settings.tensor_parallel_size,
        settings.block_size,
        settings.hybrid_kv_cache_manager,
    )
    stages = stage_ranges(shape.num_layers, settings.pipeline_parallel_size)
    room = [
        prediction.requested_bytes - weights - prediction.overhead_bytes
        for weights in stage_weights_bytes(shape, settings.tensor_parallel_size, settings.pipeline_parallel_size)
    ]
    length = largest_max_model_len(
        kv_groups(layers), stages, room, prediction.max_model_len - 1, prediction.max_num_batched_tokens
    )
    if length < 1:
        return None
    return Fix("max_model_len", length, f"max_model_len {length:,} (the largest that fits)")


def _tensor_parallel_fix(shape: ModelShape, settings: InstanceSettings, limit: int) -> Fix | None:
    sizes = [2**power for power in range(1, limit.bit_length()) if settings.tensor_parallel_size < 2**power <= limit]
    for size in sizes:
        candidate = dataclasses.replace(settings, tensor_parallel_size=size)
        try:
            _check(shape, candidate)
        except CapacityError:
            continue
        if _fits(predict(shape, candidate)):
            return Fix("tensor_parallel_size", size, f"tensor_parallel_size {size}")
    return None


def fits(
    shape: ModelShape, settings: InstanceSettings, max_tensor_parallel_size: int = MAX_TENSOR_PARALLEL_SIZE
) -> Verdict:
    """Whether vLLM would start this instance with room for one request at max_model_len; if not, the number
    that does not fit and each single change that fixes it, the smallest first: a higher utilisation (up to
    0.95), an fp8 KV cache, the largest max_model_len that fits, the smallest power-of-two TP size that fits
    and divides the heads (more GPUs last)."""
    prediction = predict(shape, settings)
    if _fits(prediction):
        return Verdict(True, prediction)
    candidates = (
        _utilization_fix(shape, settings),
        _kv_dtype_fix(shape, settings),
        _max_model_len_fix(shape, prediction),
        _tensor_parallel_fix(shape, settings, max_tensor_parallel_size),
    )
    fixes = tuple(fix for fix in candidates if fix is not None)
    return Verdict(False, prediction, _problem(shape, prediction), fixes)
