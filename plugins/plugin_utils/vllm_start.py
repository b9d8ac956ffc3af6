# -*- coding: utf-8 -*-
"""Where one vLLM start spends its time, read from the lines vLLM logs while it starts (its journal).

vLLM times most phases itself (model loading, Dynamo, Inductor's graph compiles or their loads from the compile
cache, the profiling run, CUDA graph capture, the engine's whole initialisation); the rest of the engine's
initialisation is what none of those lines cover: on a GPU mostly the kernels JIT-built at the first warm-up
(flashinfer's, 104 s of 121 s on the real H200 capture). The wall-clock figures come from vLLM's own timestamps
(whole seconds): from its first line to "Starting vLLM server".
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime

# "(EngineCore pid=6810) INFO 12-01 09:30:13 [default_loader.py:430] Loading weights took 0.03 seconds"
_LINE = re.compile(r"(?:INFO|WARNING|DEBUG|ERROR) (\d\d-\d\d \d\d:\d\d:\d\d)(?:\.\d+)? \[[^\]]+\] (.*)$")
_NUMBER = r"([0-9]+(?:\.[0-9]+)?)"
# Each phase vLLM times itself, by the message that reports it (vLLM 0.26 to 0.32 say "took" or "takes").
_PHASES: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("model_load", re.compile(r"^Model loading took [0-9.]+ GiB (?:memory )?and " + _NUMBER + r" seconds")),
    ("dynamo", re.compile(r"^Dynamo bytecode transform time: " + _NUMBER + r" s")),
    ("graph_compile", re.compile(r"^Compiling a graph for .* (?:takes|took) " + _NUMBER + r" s")),
    (
        "graph_cache_load",
        re.compile(r"^Directly load the compiled graph\(s\) .*from the cache, took " + _NUMBER + r" s"),
    ),
    ("compile_total", re.compile(r"^torch\.compile (?:took|takes) " + _NUMBER + r" s in total")),
    ("profile_run", re.compile(r"^Initial profiling/warmup run took " + _NUMBER + r" s")),
    ("cuda_graphs", re.compile(r"^Graph capturing finished in " + _NUMBER + r" secs")),
    ("engine_init", re.compile(r"^init engine \(profile, create kv cache, warmup model\) took " + _NUMBER + r" s")),
)
# Phases vLLM may report more than once in one start (one line per compile range): their figures add up.
_SUMMED = frozenset({"graph_compile", "graph_cache_load"})
_CACHE_DIRECTORY = re.compile(r"^Using cache directory: (\S+) for vLLM's torch\.compile")
_AOT_LOADED = re.compile(r"^Directly load AOT compilation from path")
# Messages of a compiled submodule start with its tag: "[backbone] torch.compile took ...".
_TAG = re.compile(r"^\[[^\]]*\] ")
_SERVER_START = re.compile(r"^Starting vLLM (?:API )?server")
_ENGINE_START = re.compile(r"^Initializing a V1 LLM engine")


@dataclass
class StartPhases:
    """One start: the seconds of each phase vLLM reported, and what its compile cache did."""

    seconds: dict[str, float] = field(default_factory=dict)
    compile_cache_dir: str | None = None
    # True when vLLM loaded compiled graphs from its cache instead of compiling them.
    compile_cache_hit: bool = False
    to_engine_start: float | None = None
    to_server_start: float | None = None

    @property
    def engine_other(self) -> float | None:
        """The engine's initialisation less the phases vLLM timed inside it: JIT builds and warm-up."""
        total = self.seconds.get("engine_init")
        if total is None:
            return None
        timed = sum(self.seconds.get(name, 0.0) for name in ("compile_total", "profile_run", "cuda_graphs"))
        return max(round(total - timed, 2), 0.0)

    def as_dict(self) -> dict[str, object]:
        return {
            "seconds": dict(self.seconds),
            "engine_other": self.engine_other,
            "to_engine_start": self.to_engine_start,
            "to_server_start": self.to_server_start,
            "compile_cache_dir": self.compile_cache_dir,
            "compile_cache_hit": self.compile_cache_hit,
        }


def _timestamp(text: str) -> datetime:
    # vLLM leaves the year out; a start that crosses New Year's Eve is not worth a special case.
    return datetime.strptime(text, "%m-%d %H:%M:%S")


def last_start(lines: list[str]) -> list[str]:
    """The lines of the last start in a journal that holds several: from the last engine banner on."""
    starts = [index for index, line in enumerate(lines) if "non-default args:" in line]
    return lines[starts[-1] :] if starts else lines


def start_phases(text: str) -> StartPhases:
    """The phases of the last start found in TEXT (a journal of the unit, or vLLM's own output)."""
    phases = StartPhases()
    first: datetime | None = None
    for line in last_start(text.splitlines()):
        match = _LINE.search(line)
        if not match:
            continue
        when, message = _timestamp(match.group(1)), _TAG.sub("", match.group(2).strip())
        first = first or when
        for name, pattern in _PHASES:
            found = pattern.search(message)
            if found:
                value = float(found.group(1))
                phases.seconds[name] = round(phases.seconds.get(name, 0.0) + value, 3) if name in _SUMMED else value
        directory = _CACHE_DIRECTORY.search(message)
        if directory:
            phases.compile_cache_dir = directory.group(1)
        if _AOT_LOADED.search(message) or "graph_cache_load" in phases.seconds:
            phases.compile_cache_hit = True
        if _ENGINE_START.search(message) and phases.to_engine_start is None:
            phases.to_engine_start = (when - first).total_seconds()
        if _SERVER_START.search(message):
            phases.to_server_start = (when - first).total_seconds()
    return phases
