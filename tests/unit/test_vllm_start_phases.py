"""Where a vLLM start spends its time, read from vLLM's own lines: the real H200 capture (vLLM 0.26.0, a cold
start: compiled, then flashinfer's JIT at the first warm-up) and the lab's CPU build started cold and again on
its own compile cache (tests/fixtures/vllm-start/)."""

from __future__ import annotations

import json


import pytest

from gpufleet import PROJECT_ROOT

from ansible_collections.gpufleet.fleet.plugins.plugin_utils.vllm_start import StartPhases, last_start, start_phases

FIXTURES = PROJECT_ROOT / "tests" / "fixtures"


def test_the_h200_cold_start_is_mostly_the_engine_s_untimed_warm_up() -> None:
    phases = start_phases((FIXTURES / "h200-real" / "vllm_serve.log").read_text())

    assert phases.seconds == {
        "model_load": 2.155935,
        "dynamo": 2.3,
        "graph_compile": 8.8,
        "compile_total": 11.91,
        "profile_run": 0.21,
        "cuda_graphs": 2.0,
        "engine_init": 120.66,
    }
    # 120.66 - 11.91 - 0.21 - 2: flashinfer's first JIT build and the warm-up, which no line of vLLM times.
    assert phases.engine_other == 106.54
    assert phases.compile_cache_hit is False
    assert phases.compile_cache_dir == "/WORK/home/.cache/vllm/torch_compile_cache/533e845ac2/rank_0_0/backbone"
    # 09:29:47 (the banner) -> 09:30:10 (the engine) -> 09:32:19 (the server listens).
    assert (phases.to_engine_start, phases.to_server_start) == (23.0, 152.0)


def test_a_start_from_the_compile_cache_loads_its_graphs_instead_of_compiling_them() -> None:
    journal = "\n".join(
        [
            "(APIServer pid=1) INFO 12-07 05:00:00 [utils.py:1] non-default args: {'model': '/m'}",
            "(EngineCore pid=2) INFO 12-07 05:00:05 [core.py:1] Initializing a V1 LLM engine (v0.32.0) with config: x",
            "(EngineCore pid=2) INFO 12-07 05:00:09 [backends.py:1] Using cache directory: /c/vllm/torch_compile_cache/"
            "ab/rank_0_0/backbone for vLLM's torch.compile",
            "(EngineCore pid=2) INFO 12-07 05:00:09 [backends.py:2] Directly load the compiled graph(s) for compile range"
            " (1, 512) from the cache, took 0.412 s",
            "(EngineCore pid=2) INFO 12-07 05:00:09 [backends.py:2] Directly load the compiled graph(s) for compile range"
            " (513, 2048) from the cache, took 0.100 s",
            "(EngineCore pid=2) INFO 12-07 05:00:10 [monitor.py:3] [backbone] torch.compile took 1.05 s in total",
            "(EngineCore pid=2) INFO 12-07 05:00:11 [core.py:4] init engine (profile, create kv cache, warmup model)"
            " took 3.50 s (compilation: 1.05 s)",
            "(APIServer pid=1) INFO 12-07 05:00:13 [api_server.py:5] Starting vLLM server on http://127.0.0.1:8000",
        ]
    )

    phases = start_phases(journal)

    assert phases.compile_cache_hit is True
    assert phases.seconds["graph_cache_load"] == pytest.approx(0.512)
    assert "graph_compile" not in phases.seconds
    # The tagged line ("[backbone] torch.compile took") counts like an untagged one.
    assert phases.seconds["compile_total"] == 1.05
    assert phases.engine_other == 2.45
    assert (phases.to_engine_start, phases.to_server_start) == (5.0, 13.0)


def test_only_the_last_start_of_a_journal_counts() -> None:
    first = "(APIServer pid=1) INFO 12-07 04:00:00 [utils.py:1] non-default args: {}"
    compiled = (
        "(EngineCore pid=2) INFO 12-07 04:00:30 [backends.py:1] Compiling a graph for compile range (1, 8) takes 9.00 s"
    )
    again = "(APIServer pid=3) INFO 12-07 05:00:00 [utils.py:1] non-default args: {}"
    aot = "(EngineCore pid=4) INFO 12-07 05:00:04 [decorators.py:1] Directly load AOT compilation from path /c/x/model"

    assert last_start([first, compiled, again, aot]) == [again, aot]
    phases = start_phases("\n".join([first, compiled, again, aot]))
    assert phases.seconds == {}
    assert phases.compile_cache_hit is True
    assert phases.engine_other is None


def test_lines_that_are_not_vllm_s_own_are_skipped() -> None:
    assert start_phases("Traceback (most recent call last):\nsystemd[1]: Started vllm@main.service.\n").as_dict() == {
        "seconds": {},
        "engine_other": None,
        "to_engine_start": None,
        "to_server_start": None,
        "compile_cache_dir": None,
        "compile_cache_hit": False,
    }


H100 = FIXTURES / "h100-real" / "time-to-serving"


def h100(name: str) -> StartPhases:
    return start_phases((H100 / f"{name}.log").read_text())


def test_on_an_h100_a_shipped_cache_starts_like_a_restart_and_flashinfer_s_jit_build_is_skipped() -> None:
    """scripts/verify-local-vllm.sh with TIME_TO_SERVING=1 (vLLM 0.26.0, torch 2.11.0+cu130): a cold start, a
    restart on its own caches, a start in an empty home at the same path given those caches by the role's code."""
    cold, restart, shipped = h100("cold"), h100("restart"), h100("shipped")

    assert cold.compile_cache_hit is False and cold.seconds["graph_compile"] == 8.39
    # flashinfer's first JIT build of the sampler at warm-up: most of the cold start.
    assert cold.engine_other == 98.32
    for warm in (restart, shipped):
        assert warm.compile_cache_hit is True and "graph_compile" not in warm.seconds
        assert warm.engine_other is not None and warm.engine_other < 3
        assert warm.compile_cache_dir == cold.compile_cache_dir
    figures = json.loads((H100 / "time-to-serving.json").read_text())["starts"]
    assert figures["(a) cold"]["healthy_s"] == 168.3
    assert figures["(c) shipped"]["healthy_s"] / figures["(b) restart"]["healthy_s"] < 1.2


def test_on_an_h100_a_cache_in_another_home_or_with_ninja_s_logs_as_built_is_built_again() -> None:
    """The two runs before the fixes: the caches installed in a home of another path (vLLM's compile-cache hash
    differs, so it compiles again) and at the same path with flashinfer's ninja logs left as the builder wrote them
    (ninja finds its outputs out of date and flashinfer's JIT build runs again)."""
    other_home, logs_as_built = h100("shipped-other-home"), h100("shipped-ninja-logs-not-rebased")

    assert other_home.compile_cache_hit is False and other_home.seconds["graph_compile"] == 3.75
    assert other_home.compile_cache_dir is not None and "/home-shipped/" in other_home.compile_cache_dir
    assert other_home.engine_other == 89.05
    assert logs_as_built.compile_cache_hit is True
    assert logs_as_built.engine_other == 70.2
