"""Times `gpufleet lab up --hosts 2`: cold (no cached root file system), warm, and on an already-running lab.

Usage: .venv/bin/python bench/lab_up.py [--hosts N]   (as root)

It runs on a lab of its own (prefix "bench", its own state directory and inventory) so the shared lab
keeps running. "Cold" points GPUFLEET_CACHE at an empty directory, so the root file system is built by
mmdebstrap exactly as on a fresh machine, without moving the shared cache away from other users of it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
GPUFLEET = Path(sys.executable).with_name("gpufleet")


def timed(command: list[str], env: dict[str, str]) -> float:
    """Runs a command, fails loudly if it fails, returns its wall time in seconds."""
    started = time.monotonic()
    result = subprocess.run(command, env=env, cwd=PROJECT_ROOT, capture_output=True, text=True, check=False)
    elapsed = time.monotonic() - started
    if result.returncode != 0:
        sys.exit(f"bench: {' '.join(command)} failed ({result.returncode}):\n{result.stdout}{result.stderr}")
    return elapsed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufleet-bench-", dir="/var/tmp"))
    env = dict(
        os.environ,
        GPUFLEET_CACHE=str(work / "cache"),
        GPUFLEET_LAB_DIR=str(work / "lab"),
        GPUFLEET_LAB_PREFIX="bench",
        GPUFLEET_LAB_INVENTORY=str(work / "hosts.yml"),
    )
    up = [str(GPUFLEET), "lab", "up", "--hosts", str(args.hosts)]
    down = [str(GPUFLEET), "lab", "down"]
    figures: dict[str, float] = {}
    try:
        figures["cold (empty cache)"] = timed(up, env)
        figures["down"] = timed(down, env)
        figures["warm (cached rootfs)"] = timed(up, env)
        figures["already up"] = timed(up, env)
    finally:
        subprocess.run(down, env=env, cwd=PROJECT_ROOT, capture_output=True, check=False)
        shutil.rmtree(work, ignore_errors=True)
    print(f"gpufleet lab up --hosts {args.hosts}")
    print("  ".join(f"{name:>22}" for name in figures))
    print("  ".join(f"{seconds:>21.1f}s" for seconds in figures.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
