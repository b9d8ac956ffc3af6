"""What the unit and lab tests of data/monitoring/ share: Prometheus's own tools from Debian's packages, and the
shipped dashboard's queries as Prometheus evaluates them.

Each package is downloaded with apt-get from the archive the machine is configured with and unpacked once into
the controller cache, never installed. Several test workers may ask at once: a lock makes one of them unpack.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from gpufleet import PROJECT_ROOT

CACHE = Path(os.environ.get("GPUFLEET_CACHE") or "/var/cache/gpufleet")
MONITORING = PROJECT_ROOT / "data" / "monitoring"
DASHBOARD = MONITORING / "grafana-dashboard.json"


def debian_tool(package: str, name: str) -> Path:
    """The path of /usr/bin/NAME of Debian's PACKAGE, unpacking the package on first use."""
    root = CACHE / "tools" / f"{package}-deb"
    tool = root / "usr" / "bin" / name
    if tool.is_file():
        return tool
    root.parent.mkdir(parents=True, exist_ok=True)
    with (root.parent / f".{package}-deb.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not tool.is_file():
            _unpack(package, root)
    assert tool.is_file(), f"Debian's {package} package has no /usr/bin/{name}"
    return tool


def _unpack(package: str, root: Path) -> None:
    with tempfile.TemporaryDirectory(prefix=f"gpufleet-{package}-") as work:
        download = subprocess.run(
            ["apt-get", "download", package], cwd=work, capture_output=True, text=True, timeout=600, check=False
        )
        assert download.returncode == 0, f"apt-get download {package} failed: {download.stderr}"
        deb = next(Path(work).glob(f"{package}_*.deb"))
        # Unpacked beside the target (same file system), then renamed: never a half-unpacked tree in the cache.
        staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
        subprocess.run(["dpkg-deb", "-x", str(deb), str(staging)], check=True)
        shutil.rmtree(root, ignore_errors=True)
        staging.rename(root)


def dashboard_panels() -> list[tuple[str, str]]:
    """(panel title, query) of every query of the shipped Grafana dashboard, in Prometheus's terms: Grafana's
    variables replaced by what the dashboard shows by default (every node, every instance)."""
    dashboard = json.loads(DASHBOARD.read_text())
    return [
        (panel["title"], to_promql(target["expr"]))
        for panel in dashboard["panels"]
        for target in panel.get("targets", [])
    ]


def to_promql(query: str) -> str:
    return query.replace("$__rate_interval", "1m").replace("$node", ".*").replace("$instance", ".*")
