"""Inductor's and Triton's caches shipped between two homes on a real GPU, with the code the vllm_service role ships
them with (plugins/module_utils/compile_cache.py): the GPU half of issue 33 that needs no vLLM wheelhouse.

Usage: PYTHON=/path/to/venv/bin/python python3 bench/compile_cache_gpu.py [--out DIR]

A small bfloat16 transformer-like stack is compiled with torch.compile (Inductor, Triton kernels for the GPU) in a
fresh process each time, timed from the first call to its result:
  (a) cold:    an empty home (no Inductor or Triton cache);
  (b) warm:    the same home again, on the caches (a) left;
  (c) shipped: a second empty home given (a)'s caches packed, verified and installed as the role does;
  (d) cold:    another empty home, to show (a) was not a first-process effect.
Inductor's FX-graph cache hits and misses are read from torch's own counters.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT / "collections"))

from ansible_collections.gpufleet.fleet.plugins.module_utils import compile_cache  # noqa: E402

WORKLOAD = r"""
import json, sys, time
import torch
from torch._dynamo.utils import counters

class Block(torch.nn.Module):
    def __init__(self, width):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.out = torch.nn.Linear(width, width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
        x = x + self.out(torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))

torch.manual_seed(0)
model = torch.nn.Sequential(*[Block(1024) for _ in range(4)]).cuda().to(torch.bfloat16)
compiled = torch.compile(model)
x = torch.randn(8, 256, 1024, device="cuda", dtype=torch.bfloat16)
started = time.perf_counter()
with torch.no_grad():
    compiled(x)
torch.cuda.synchronize()
first = time.perf_counter() - started
print(json.dumps({
    "first_call": round(first, 2),
    "fxgraph_cache_hit": counters["inductor"]["fxgraph_cache_hit"],
    "fxgraph_cache_miss": counters["inductor"]["fxgraph_cache_miss"],
    "gpu": torch.cuda.get_device_name(0),
    "torch": torch.__version__,
}))
"""


def run(python: str, home: Path) -> dict:
    cache = home / ".cache"
    env = dict(
        os.environ,
        HOME=str(home),
        TORCHINDUCTOR_CACHE_DIR=str(cache / "torchinductor"),
        TRITON_CACHE_DIR=str(cache / "triton"),
    )
    started = time.perf_counter()
    result = subprocess.run([python, "-c", WORKLOAD], capture_output=True, text=True, env=env, check=False)
    if result.returncode != 0:
        sys.exit(f"the workload failed in {home}:\n{result.stderr[-4000:]}")
    figures = json.loads(result.stdout.strip().splitlines()[-1])
    figures["process"] = round(time.perf_counter() - started, 2)
    figures["files"] = sum(len(files) for _, _, files in os.walk(cache))
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="directory to write the figures to (figures.json)")
    options = parser.parse_args()
    python = os.environ.get("PYTHON", sys.executable)
    with tempfile.TemporaryDirectory(prefix="gpufleet-compile-cache-") as directory:
        root = Path(directory)
        homes = {name: root / name for name in ("built", "shipped", "other")}
        for home in homes.values():
            home.mkdir()
        figures = {"(a) cold": run(python, homes["built"]), "(b) warm": run(python, homes["built"])}
        components = {"torch": figures["(a) cold"]["torch"], "gpu": figures["(a) cold"]["gpu"]}
        key = compile_cache.cache_key(components)
        packed = compile_cache.pack(str(homes["built"]), key, components, str(root / "cache.tar"))
        installed = compile_cache.install(packed["archive"], packed["sha256"], key, str(homes["shipped"]))
        figures["(c) shipped"] = run(python, homes["shipped"])
        figures["(d) cold again"] = run(python, homes["other"])
    print(
        f"{figures['(a) cold']['gpu']}, torch {figures['(a) cold']['torch']}; shipped {packed['size'] / 1e6:.1f} MB "
        f"({', '.join(installed)}), sha256 {packed['sha256'][:16]}"
    )
    print(f"{'start':<16}{'first call s':>13}{'process s':>11}{'FX hits':>9}{'FX misses':>11}{'cache files':>13}")
    for name, row in figures.items():
        print(
            f"{name:<16}{row['first_call']:>13.2f}{row['process']:>11.2f}{row['fxgraph_cache_hit']:>9}"
            f"{row['fxgraph_cache_miss']:>11}{row['files']:>13}"
        )
    print(f"(c)/(b) first call: {figures['(c) shipped']['first_call'] / figures['(b) warm']['first_call']:.2f}")
    if options.out:
        options.out.mkdir(parents=True, exist_ok=True)
        (options.out / "figures.json").write_text(json.dumps(figures, indent=1))


if __name__ == "__main__":
    main()
