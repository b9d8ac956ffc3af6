"""Network namespaces and veth pairs: each lab host gets its own namespace linked to the controller."""

from __future__ import annotations

import json
import subprocess
import threading
from pathlib import Path

from gpufleet.errors import GpufleetError
from gpufleet.lab.addressing import HostAddress

NETNS_DIR = Path("/run/netns")
_NETNS_ADD_LOCK = threading.Lock()


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, check=False)
    if check and result.returncode != 0:
        raise GpufleetError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return result


def netns_path(name: str) -> str:
    return str(NETNS_DIR / name)


def netns_exists(name: str) -> bool:
    return (NETNS_DIR / name).exists()


def list_netns() -> list[str]:
    return sorted(path.name for path in NETNS_DIR.iterdir()) if NETNS_DIR.is_dir() else []


def list_links() -> list[str]:
    result = _ip("-json", "link", "show")
    return [link["ifname"] for link in json.loads(result.stdout or "[]")]


def link_is_up(name: str) -> bool:
    result = _ip("-json", "link", "show", "dev", name, check=False)
    if result.returncode != 0:
        return False
    links = json.loads(result.stdout or "[]")
    return bool(links) and "UP" in links[0].get("flags", [])


def host_network_ok(name: str, veth: str, address: HostAddress) -> bool:
    """True when the namespace, the controller's veth end (up) and its gateway address all exist."""
    if not netns_exists(name) or not link_is_up(veth):
        return False
    result = _ip("-json", "-4", "addr", "show", "dev", veth, check=False)
    addrs = json.loads(result.stdout or "[]") if result.returncode == 0 else []
    return any(info.get("local") == str(address.gateway) for link in addrs for info in link.get("addr_info", []))


def create_host_network(name: str, veth: str, address: HostAddress) -> None:
    """Namespace `name` with eth0 = host address, default route via the controller's end `veth`."""
    # `ip netns add` sets up the /run/netns mount on first use; concurrent first uses can race.
    with _NETNS_ADD_LOCK:
        _ip("netns", "add", name)
    _ip("link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", name)
    _ip("addr", "add", f"{address.gateway}/{address.prefixlen}", "dev", veth)
    _ip("link", "set", veth, "up")
    _ip("-n", name, "link", "set", "lo", "up")
    _ip("-n", name, "addr", "add", f"{address.host}/{address.prefixlen}", "dev", "eth0")
    _ip("-n", name, "link", "set", "eth0", "up")
    _ip("-n", name, "route", "add", "default", "via", str(address.gateway))


# The lab's cluster network (role ray_cluster): a veth pair straight between the first two hosts' namespaces,
# never through the controller (which forwards nothing). It lives in those namespaces only, so every lab can
# use the same addresses.
CLUSTER_IFNAME = "cluster0"
CLUSTER_ADDRESSES = ("10.254.0.1", "10.254.0.2")
CLUSTER_PREFIXLEN = 30


def _has_address(namespace: str, address: str) -> bool:
    result = _ip("-n", namespace, "-json", "-4", "addr", "show", "dev", CLUSTER_IFNAME, check=False)
    links = json.loads(result.stdout or "[]") if result.returncode == 0 else []
    return any(
        "UP" in link.get("flags", []) and any(info.get("local") == address for info in link.get("addr_info", []))
        for link in links
    )


def ensure_cluster_link(first: str, second: str) -> bool:
    """The cluster link between namespaces `first` and `second`, made again when either end is missing or
    down (a host's namespace made anew takes its end with it); True when it was made."""
    if _has_address(first, CLUSTER_ADDRESSES[0]) and _has_address(second, CLUSTER_ADDRESSES[1]):
        return False
    for namespace in (first, second):
        _ip("-n", namespace, "link", "del", CLUSTER_IFNAME, check=False)
    _ip("link", "add", CLUSTER_IFNAME, "netns", first, "type", "veth", "peer", "name", CLUSTER_IFNAME, "netns", second)
    for namespace, address in zip((first, second), CLUSTER_ADDRESSES):
        _ip("-n", namespace, "addr", "add", f"{address}/{CLUSTER_PREFIXLEN}", "dev", CLUSTER_IFNAME)
        _ip("-n", namespace, "link", "set", CLUSTER_IFNAME, "up")
    return True


def delete_host_network(name: str, veth: str) -> list[str]:
    """Removes the veth pair and the namespace if present; returns what was removed."""
    removed = []
    if veth in list_links():
        _ip("link", "del", veth)
        removed.append(f"veth {veth}")
    if netns_exists(name):
        _ip("netns", "del", name)
        removed.append(f"netns {name}")
    return removed
