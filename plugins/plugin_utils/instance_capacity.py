# -*- coding: utf-8 -*-
"""Will each declared vLLM instance fit its GPUs? The capacity planner (capacity.py) applied to an inventory
host's instances (issue 34): the model's shape from the small files of its repository that its model_store_models
entry names (`shape`: a controller directory with config.json and model.safetensors.index.json), the GPU's
memory from the knowledge base, the instance's own settings. Controller-only (plugin_utils); standard library
only. The action plugin capacity_check runs it in preflight, so `gpufleet plan` and every provision refuse what
cannot start before any host is touched."""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ansible_collections.gpufleet.fleet.plugins.plugin_utils import capacity
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.gpu_memory import GpuMemory, GpuMemoryError
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.model_shape import ModelShape, ShapeError, read_model_dir

# vLLM's human-readable integers (vllm/engine/arg_utils.py human_readable_int): k/m/g decimal, K/M/G binary.
_SUFFIXES = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
# vLLM 0.21 to 0.25 subtract their CUDA-graph estimate from the KV budget; 0.26.0 did not on the project's H200
# (capacity.py, tests/fixtures/h200-real/vllm_serve.log).
_CUDAGRAPH_PROFILED = ((0, 21), (0, 26))


class InstanceError(ValueError):
    """A declared value the planner cannot read: the message names it."""


@dataclass(frozen=True)
class InstanceCapacity:
    instance: str
    model: str
    status: str  # fits | does_not_fit | refused | not_checked
    message: str
    figures: dict[str, Any] = field(default_factory=dict)
    fixes: tuple[dict[str, Any], ...] = ()

    def as_dict(self) -> dict[str, Any]:
        return {
            "instance": self.instance,
            "model": self.model,
            "status": self.status,
            "message": self.message,
            "figures": self.figures,
            "fixes": list(self.fixes),
        }


def length_of(value: Any, name: str) -> int | None:
    """An engine argument given as 4096, "4096", "32k" or "1M"; None when not given; -1 or "auto" is None too
    (vLLM then takes the largest max_model_len that fits, which the plan reports)."""
    if value is None or value == "" or str(value).lower() in ("auto", "-1"):
        return None
    if isinstance(value, bool):
        raise InstanceError(f"{name} {value!r} is not a number")
    if isinstance(value, int):
        return value
    match = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)([kmgKMG]?)", str(value).strip())
    if match is None:
        raise InstanceError(f"{name} {value!r} is not a number (vLLM takes 4096, 32k or 1M)")
    number, suffix = match.groups()
    return int(float(number) * _SUFFIXES.get(suffix, 1))


def _extra_arg(extra_args: Sequence[str], flag: str) -> str | None:
    """The value of --flag N or --flag=N in extra_args (the last one wins, as with argparse)."""
    found = None
    for index, item in enumerate(extra_args):
        if item == flag and index + 1 < len(extra_args):
            found = extra_args[index + 1]
        elif item.startswith(flag + "="):
            found = item.split("=", 1)[1]
    return found


def cudagraph_profiled(vllm_version: str) -> bool:
    parts = re.findall(r"[0-9]+", vllm_version or "")[:2]
    if len(parts) < 2:
        return True
    version = (int(parts[0]), int(parts[1]))
    return _CUDAGRAPH_PROFILED[0] <= version < _CUDAGRAPH_PROFILED[1]


def settings_of(instance: Mapping[str, Any], gpu: GpuMemory, vllm_version: str) -> capacity.InstanceSettings:
    extra = [str(item) for item in instance.get("extra_args") or []]
    block = _extra_arg(extra, "--block-size")
    return capacity.InstanceSettings(
        gpu_memory_bytes=gpu.cuda_total_bytes,
        tensor_parallel_size=int(instance.get("tensor_parallel_size") or 1),
        pipeline_parallel_size=int(instance.get("pipeline_parallel_size") or 1),
        max_model_len=length_of(instance.get("max_model_len"), "max_model_len"),
        gpu_memory_utilization=float(instance.get("gpu_memory_utilization") or 0.9),
        kv_cache_dtype=str(instance.get("kv_cache_dtype") or "auto"),
        block_size=int(block) if block else None,
        max_num_batched_tokens=length_of(instance.get("max_num_batched_tokens"), "max_num_batched_tokens"),
        max_num_seqs=int(instance["max_num_seqs"]) if instance.get("max_num_seqs") else None,
        gpu_name=f"{gpu.match} {gpu.variant}",
        enforce_eager=bool(instance.get("enforce_eager")),
        cudagraph_memory_profiled=cudagraph_profiled(vllm_version),
        hybrid_kv_cache_manager="--disable-hybrid-kv-cache-manager" not in extra,
    )


def model_entry(instance_model: str, models: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    """The model_store_models entry an instance serves: the one whose name is the last part of its model path."""
    if not str(instance_model).startswith("/"):
        return None
    name = os.path.basename(str(instance_model).rstrip("/"))
    return next((entry for entry in models if entry.get("name") == name), None)


def shape_of(instance: Mapping[str, Any], models: Sequence[Mapping[str, Any]]) -> ModelShape:
    model = str(instance.get("model", ""))
    entry = model_entry(model, models)
    if entry is None or not entry.get("shape"):
        name = os.path.basename(model.rstrip("/"))
        if not model.startswith("/"):
            what = "not a model staged by model_store (the planner reads no hub)"
        elif entry is None:
            what = f"no model_store_models entry is named {name!r}"
        else:
            what = f"the model_store_models entry {name!r} has no shape"
        raise InstanceError(
            f"{model}: {what}: serve it from a model_store_models entry with `shape:` (a controller directory "
            "holding the model's config.json and model.safetensors.index.json), or opt the instance out with "
            "capacity_check: false"
        )
    return read_model_dir(str(entry["shape"]), entry.get("config_overrides") or {})


def _figures(prediction: capacity.Prediction, gpu: GpuMemory) -> dict[str, Any]:
    kv = prediction.capacity
    return {
        "gpu": f"{gpu.match} {gpu.variant}",
        "gpu_memory_bytes": gpu.cuda_total_bytes,
        "gpu_memory_assumed": gpu.assumed,
        "requested_bytes": prediction.requested_bytes,
        "weights_bytes_per_gpu": prediction.weights_bytes_per_gpu,
        "activation_peak_bytes": prediction.activation_peak_bytes,
        "non_torch_bytes": prediction.non_torch_bytes,
        "cudagraph_bytes": prediction.cudagraph_bytes,
        "kv_cache_bytes": prediction.kv_cache_bytes,
        "kv_bytes_per_token": dict(prediction.kv_bytes_per_token),
        "kv_cache_tokens": kv.tokens,
        "max_model_len": prediction.max_model_len,
        "max_concurrency": round(kv.max_concurrency, 2),
    }


def _fix_text(fix: capacity.Fix, instance: Mapping[str, Any]) -> str:
    if fix.setting == "tensor_parallel_size" and len(instance.get("gpus") or []) < int(fix.value):
        return f"{fix.text} over {fix.value} GPUs (gpus lists {len(instance.get('gpus') or [])})"
    return fix.text


def kv_cache_memory(instance: Mapping[str, Any]) -> int | None:
    """A KV cache of a fixed size per GPU (--kv-cache-memory, --kv-cache-memory-bytes before vLLM 0.11), which vLLM
    then allocates instead of what gpu_memory_utilization leaves."""
    extra = [str(item) for item in instance.get("extra_args") or []]
    value = _extra_arg(extra, "--kv-cache-memory") or _extra_arg(extra, "--kv-cache-memory-bytes")
    return length_of(value, "--kv-cache-memory") if value else None


def check_fixed_kv_instance(
    instance: Mapping[str, Any], shape: ModelShape, gpu: GpuMemory, settings: capacity.InstanceSettings, space: int
) -> InstanceCapacity:
    """An instance whose KV cache has a declared size: it must hold one request at max_model_len, and the weights,
    the overheads and that cache must fit the GPU's memory."""
    name, model = str(instance["name"]), str(instance.get("model", ""))
    prediction = capacity.predict(shape, settings)
    kv = capacity.predict_fixed_space(
        shape,
        space,
        max_model_len=settings.max_model_len,
        kv_cache_dtype=settings.kv_cache_dtype,
        block_size=settings.block_size,
        tensor_parallel_size=settings.tensor_parallel_size,
        pipeline_parallel_size=settings.pipeline_parallel_size,
        max_num_batched_tokens=prediction.max_num_batched_tokens,
        hybrid_kv_cache_manager=settings.hybrid_kv_cache_manager,
    )
    used = prediction.weights_bytes_per_gpu + prediction.overhead_bytes + space
    figures = {
        **_figures(prediction, gpu),
        "kv_cache_bytes": space,
        "kv_cache_tokens": kv.tokens,
        "max_concurrency": round(kv.max_concurrency, 2),
    }
    tokens, concurrency = kv.log_lines()
    where = f"{shape.architecture or shape.model_type} on {gpu.describe()}, --kv-cache-memory {capacity.gib(space)}"
    if not kv.fits_one_request:
        return InstanceCapacity(
            name,
            model,
            "does_not_fit",
            f"{where}: does not fit: one request of max_model_len {kv.max_model_len:,} tokens needs "
            f"{capacity.gib(kv.bytes_needed_per_request)} of KV cache per GPU; fix: a larger --kv-cache-memory or a "
            "smaller max_model_len",
            figures,
        )
    if used > gpu.cuda_total_bytes:
        return InstanceCapacity(
            name,
            model,
            "does_not_fit",
            f"{where}: does not fit: weights {capacity.gib(prediction.weights_bytes_per_gpu)} + overheads "
            f"{capacity.gib(prediction.overhead_bytes)} + KV cache {capacity.gib(space)} exceed the GPU's "
            f"{capacity.gib(gpu.cuda_total_bytes)}; fix: a smaller --kv-cache-memory or a larger tensor_parallel_size",
            figures,
        )
    return InstanceCapacity(name, model, "fits", f"{where}: fits: {tokens}; {concurrency}", figures)


def check_gpu_instance(
    instance: Mapping[str, Any], shape: ModelShape, gpu: GpuMemory, vllm_version: str
) -> InstanceCapacity:
    name, model = str(instance["name"]), str(instance.get("model", ""))
    settings = settings_of(instance, gpu, vllm_version)
    space = kv_cache_memory(instance)
    if space is not None:
        return check_fixed_kv_instance(instance, shape, gpu, settings, space)
    auto_length = settings.max_model_len is None and instance.get("max_model_len") not in (None, "")
    verdict = capacity.fits(shape, settings)
    largest = next((fix for fix in verdict.fixes if fix.setting == "max_model_len"), None)
    if not verdict.fits and auto_length and largest is not None:
        # max_model_len auto: vLLM takes the largest that fits; plan with it.
        settings = dataclasses.replace(settings, max_model_len=int(largest.value))
        verdict = capacity.fits(shape, settings)
    figures = _figures(verdict.prediction, gpu)
    where = (
        f"{shape.architecture or shape.model_type} on {gpu.describe()}, tensor_parallel_size "
        f"{settings.tensor_parallel_size}"
    )
    if verdict.fits:
        return InstanceCapacity(name, model, "fits", f"{where}: {verdict.message()}", figures)
    texts = [_fix_text(fix, instance) for fix in verdict.fixes]
    fixes = tuple(
        {"setting": fix.setting, "value": fix.value, "text": text}
        for fix, text in zip(verdict.fixes, texts, strict=True)
    )
    remedy = "fix: " + ", or ".join(texts) if texts else "no single change fixes it"
    text = f"does not fit: {verdict.problem}; {remedy}"
    return InstanceCapacity(name, model, "does_not_fit", f"{where}: {text}", figures, fixes)


def check_cpu_instance(instance: Mapping[str, Any], shape: ModelShape) -> InstanceCapacity:
    """vLLM's CPU backend takes VLLM_CPU_KVCACHE_SPACE GiB for its KV cache, whatever the memory."""
    name, model = str(instance["name"]), str(instance.get("model", ""))
    space = (instance.get("env") or {}).get("VLLM_CPU_KVCACHE_SPACE")
    if not space:
        return InstanceCapacity(name, model, "not_checked", "CPU backend without VLLM_CPU_KVCACHE_SPACE: not sized")
    extra = [str(item) for item in instance.get("extra_args") or []]
    block = _extra_arg(extra, "--block-size")
    kv = capacity.predict_fixed_space(
        shape,
        int(float(space) * capacity.GiB),
        max_model_len=length_of(instance.get("max_model_len"), "max_model_len"),
        kv_cache_dtype=str(instance.get("kv_cache_dtype") or "auto"),
        block_size=int(block) if block else None,
        tensor_parallel_size=int(instance.get("tensor_parallel_size") or 1),
        pipeline_parallel_size=int(instance.get("pipeline_parallel_size") or 1),
    )
    figures = {
        "kv_cache_bytes": kv.available_bytes,
        "kv_cache_tokens": kv.tokens,
        "max_model_len": kv.max_model_len,
        "max_concurrency": round(kv.max_concurrency, 2),
    }
    # vLLM's CPU backend logs the same two figures as "CPU KV cache size: ..., Maximum concurrency ...".
    tokens, concurrency = (line.replace("GPU KV cache", "CPU KV cache") for line in kv.log_lines())
    where = f"{shape.architecture or shape.model_type} on the CPU backend, VLLM_CPU_KVCACHE_SPACE {space} GiB"
    if kv.fits_one_request:
        return InstanceCapacity(name, model, "fits", f"{where}: {tokens}; {concurrency}", figures)
    return InstanceCapacity(
        name,
        model,
        "does_not_fit",
        f"{where}: one request of max_model_len {kv.max_model_len:,} tokens needs "
        f"{capacity.gib(kv.bytes_needed_per_request)} of KV cache, {space} GiB is set: raise VLLM_CPU_KVCACHE_SPACE "
        "or lower max_model_len",
        figures,
    )


def check_instance(
    instance: Mapping[str, Any],
    models: Sequence[Mapping[str, Any]],
    gpus: Sequence[GpuMemory],
    vllm_version: str,
    gpu_problem: str = "",
) -> InstanceCapacity:
    """One instance's verdict; every problem of its inputs is a refusal naming what is missing (gpu_problem: why
    the memory of the stack's GPUs is unknown)."""
    name, model = str(instance.get("name")), str(instance.get("model", ""))
    if instance.get("capacity_check") is False:
        return InstanceCapacity(name, model, "not_checked", "not checked: capacity_check is false for this instance")
    try:
        shape = shape_of(instance, models)
        if gpu_problem:
            raise InstanceError(gpu_problem)
        if not gpus:
            # A stack without GPUs serves with vLLM's CPU backend (the lab's vllm-cpu).
            return check_cpu_instance(instance, shape)
        # On a node of mixed GPUs, the smallest bounds every instance.
        gpu = min(gpus, key=lambda item: item.cuda_total_bytes)
        return check_gpu_instance(instance, shape, gpu, vllm_version)
    except (InstanceError, ShapeError, GpuMemoryError, capacity.CapacityError) as error:
        return InstanceCapacity(name, model, "refused", str(error))


def check_instances(
    instances: Sequence[Mapping[str, Any]],
    defaults: Mapping[str, Any],
    models: Sequence[Mapping[str, Any]],
    gpus: Sequence[GpuMemory],
    vllm_version: str,
    gpu_problem: str = "",
) -> list[InstanceCapacity]:
    """Every declared instance, with the role's defaults under each (a key given replaces the default)."""
    return [check_instance({**defaults, **instance}, models, gpus, vllm_version, gpu_problem) for instance in instances]


# What vLLM logs at start (vllm/v1/core/kv_cache_utils.py _report_kv_cache_config): "GPU KV cache size: N tokens"
# ("CPU KV cache size" on the CPU backend) and "Maximum concurrency for L tokens per request: Cx".
_LOGGED_TOKENS = re.compile(r"KV cache size: ([0-9,]+) tokens")
_LOGGED_CONCURRENCY = re.compile(r"Maximum concurrency for ([0-9,]+) tokens per request: ([0-9.]+)x")


def logged_kv_cache(text: str) -> tuple[int, int, float] | None:
    """(tokens, max_model_len, concurrency) of the last start a vLLM log shows, or None."""
    tokens, concurrency = _LOGGED_TOKENS.findall(text or ""), _LOGGED_CONCURRENCY.findall(text or "")
    if not tokens or not concurrency:
        return None
    length, times = concurrency[-1]
    return int(tokens[-1].replace(",", "")), int(length.replace(",", "")), float(times)


def compare_with_log(verdict: InstanceCapacity, text: str, tolerance: float) -> dict[str, Any]:
    """The prediction against what vLLM logged at the instance's start; `warning` when they differ by more than the
    tolerance (a fraction of vLLM's figure), naming both."""
    seen = logged_kv_cache(text)
    comparison: dict[str, Any] = {"instance": verdict.instance, "predicted": None, "logged": None, "warning": ""}
    if verdict.status != "fits" or seen is None:
        return comparison
    tokens, length, concurrency = seen
    predicted = verdict.figures["kv_cache_tokens"]
    comparison.update(predicted=predicted, logged=tokens, logged_max_model_len=length, logged_concurrency=concurrency)
    if abs(predicted - tokens) > tolerance * tokens:
        comparison["warning"] = (
            f"vllm@{verdict.instance}: vLLM allocated a KV cache of {tokens:,} tokens, the plan predicted "
            f"{predicted:,} ({(predicted - tokens) / tokens:+.1%}, more than {tolerance:.0%}): the planner's overhead "
            "estimates do not hold for this model and GPU; the figures vLLM logged are in its journal"
        )
    return comparison
