"""`gpufleet lab up|status|down`: the lab fleet (Debian 12 and 13 hosts in systemd-nspawn) and its mirror."""

from __future__ import annotations

import argparse
import time

from gpufleet.errors import GpufleetError
from gpufleet.lab import balancer, fleet
from gpufleet.lab.config import LabConfig, load_config
from gpufleet.lab.releases import DEFAULT_OS, RELEASES, parse_os_list

DEFAULT_HOSTS = 2
DEFAULT_BOOT_TIMEOUT = 180


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("lab", help="run a local lab fleet of Debian 12 or 13 hosts to test against")
    parser.add_argument("--lab-dir", help="state directory (default: $GPUFLEET_LAB_DIR or /var/lib/gpufleet/lab)")
    parser.add_argument("--prefix", help="host name prefix (default: $GPUFLEET_LAB_PREFIX or 'lab')")
    parser.add_argument("--inventory", help="inventory file to write (default: inventories/lab/hosts.yml)")
    actions = parser.add_subparsers(dest="lab_action", metavar="ACTION", required=True)

    up = actions.add_parser("up", help="start (or repair, or resize) the lab with N hosts and the mirror")
    up.add_argument("--hosts", type=int, default=DEFAULT_HOSTS, help=f"number of hosts (default {DEFAULT_HOSTS})")
    up.add_argument(
        "--os",
        help=f"the hosts' OS, or a comma-separated list cycled over them, one of {', '.join(RELEASES)} "
        f"(default: each host keeps the OS it has, a new one gets {DEFAULT_OS}; "
        f"--os debian12,debian13 gives a mixed fleet)",
    )
    up.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_BOOT_TIMEOUT,
        help=f"seconds to wait for each host to boot (default {DEFAULT_BOOT_TIMEOUT})",
    )
    up.set_defaults(func=run_up)

    status = actions.add_parser("status", help="show each host and the mirror; exit 1 unless all are up")
    status.set_defaults(func=run_status)

    down = actions.add_parser("down", help="remove every host, namespace, process and lock of the lab")
    down.set_defaults(func=run_down)


def config_from(args: argparse.Namespace) -> LabConfig:
    return load_config(lab_dir=args.lab_dir, prefix=args.prefix, inventory=args.inventory)


def run_up(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise GpufleetError(f"--timeout must be positive (got {args.timeout:g})")
    releases = parse_os_list(args.os) if args.os is not None else None
    config = config_from(args)
    started = time.monotonic()
    result = fleet.up(config, args.hosts, args.timeout, releases)
    for note in result.notes:
        print(f"lab: {note}")
    for name in result.removed:
        print(f"lab: removed {name}")
    for name, what in result.repaired.items():
        print(f"lab: repaired {name} ({what})")
    if result.created:
        print(f"lab: created {', '.join(result.created)}")
    if result.unchanged:
        print(f"lab: already healthy: {', '.join(result.unchanged)}")
    print(f"lab: {args.hosts} host(s) up in {time.monotonic() - started:.1f}s; inventory {config.inventory_path}")
    return 0


def run_status(args: argparse.Namespace) -> int:
    config = config_from(args)
    hosts, mirror_status = fleet.status(config)
    if not hosts:
        print("lab: no hosts (run `gpufleet lab up`)")
    for host in hosts:
        age = f"booted {host.boot_age_seconds}s ago (boot id {host.boot_id[:8]})" if host.up else ""
        print(f"{host.name:<8} {host.address:<15} {'up' if host.up else 'DOWN':<5} {host.state:<10} {age}".rstrip())
    if mirror_status.running:
        health = "healthy" if mirror_status.healthy else "NOT ANSWERING"
        print(f"mirror   port {mirror_status.port} on each host's gateway address: {health}")
    else:
        print("mirror   DOWN")
    front = balancer.status(config)
    print(f"balancer {front.url} (HAProxy, following each host's /health)" if front.running else "balancer DOWN")
    all_up = bool(hosts) and all(host.up for host in hosts) and mirror_status.healthy
    return 0 if all_up else 1


def run_down(args: argparse.Namespace) -> int:
    config = config_from(args)
    for line in fleet.down(config):
        print(f"lab: {line}")
    print("lab: down (caches kept)")
    return 0
