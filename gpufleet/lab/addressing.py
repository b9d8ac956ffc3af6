"""Addresses for lab hosts: one /30 per host out of a private /24 that the machine does not use yet."""

from __future__ import annotations

import ipaddress
import json
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass

from gpufleet.errors import GpufleetError

# Tried in order; rarely used corners of the private ranges, so a clash with a real network is unlikely.
# Several labs may run side by side (each engineer's or test's own prefix): offer many /24s.
CANDIDATE_POOLS = tuple(f"10.213.{n}.0/24" for n in range(7, 256)) + ("172.29.213.0/24", "192.168.213.0/24")
# A /24 holds 64 /30 subnets; index 0 is left unused so host N owns the N-th /30.
MAX_INDEX = 63


@dataclass(frozen=True)
class HostAddress:
    """The point-to-point link of one host: the controller's side (gateway) and the host's side."""

    network: ipaddress.IPv4Network
    gateway: ipaddress.IPv4Address
    host: ipaddress.IPv4Address

    @property
    def prefixlen(self) -> int:
        return self.network.prefixlen


def host_address(pool: str, index: int) -> HostAddress:
    """The /30 of host number `index` (1-based) in `pool`: .1 is the controller, .2 the host."""
    if not 1 <= index <= MAX_INDEX:
        raise ValueError(f"host index {index} is outside 1..{MAX_INDEX}")
    network = ipaddress.IPv4Network(pool)
    subnet = list(network.subnets(new_prefix=30))[index]
    first, second = list(subnet.hosts())
    return HostAddress(network=subnet, gateway=first, host=second)


def networks_in_use(ignore_interfaces: Iterable[str] = ()) -> list[ipaddress.IPv4Network]:
    """IPv4 networks of the machine's routes and addresses, except on the given (our own) interfaces."""
    ignored = set(ignore_interfaces)
    used: list[ipaddress.IPv4Network] = []
    for route in _ip_json(["-4", "route", "show", "table", "all"]):
        if route.get("dev") in ignored or route.get("dst") in (None, "default"):
            continue
        try:
            used.append(ipaddress.IPv4Network(route["dst"], strict=False))
        except ValueError:
            continue
    for link in _ip_json(["-4", "addr", "show"]):
        if link.get("ifname") in ignored:
            continue
        for info in link.get("addr_info", []):
            used.append(ipaddress.IPv4Network(f"{info['local']}/{info['prefixlen']}", strict=False))
    return used


def choose_pool(used: Iterable[ipaddress.IPv4Network], preferred: str | None = None) -> str:
    """The preferred pool if still free, else the first candidate pool that overlaps no network in use."""
    used_list = [net for net in used if not net.is_loopback]
    candidates = ([preferred] if preferred else []) + list(CANDIDATE_POOLS)
    for candidate in candidates:
        pool = ipaddress.IPv4Network(candidate)
        if not any(pool.overlaps(net) for net in used_list):
            return candidate
    raise GpufleetError(
        "every candidate lab address range (10.213.7-255.0/24, 172.29.213.0/24, 192.168.213.0/24) overlaps "
        "a network on this machine; free one of them or run `gpufleet lab down` for other labs"
    )


def _ip_json(args: list[str]) -> list[dict]:
    result = subprocess.run(["ip", "-json", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise GpufleetError(f"`ip {' '.join(args)}` failed: {result.stderr.strip()}")
    return json.loads(result.stdout or "[]")
