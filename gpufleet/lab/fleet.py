"""`gpufleet lab up|status|down`: bring the lab fleet to N healthy hosts, report on it, remove it."""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from gpufleet.errors import GpufleetError
from gpufleet.lab import host as hostlib
from gpufleet.lab import balancer, inventory, keys, locks, mirror, network, pools, preflight, rootfs, state
from gpufleet.lab.addressing import host_address
from gpufleet.lab.config import MIRROR_PORT, LabConfig
from gpufleet.lab.host import Host
from gpufleet.lab.releases import DEFAULT_OS, RELEASES, OsRelease, host_releases
from gpufleet.lab.procs import is_alive, pids_with_argument, read_pid_file, stop_processes

# nspawn powers the container off on SIGTERM; the supervisor allows 45 s before killing it.
HOST_STOP_SECONDS = 60
LOCK_RELEASE_SECONDS = 15

T = TypeVar("T")
R = TypeVar("R")


@dataclass
class UpResult:
    """What `lab up` did to each host."""

    unchanged: list[str] = field(default_factory=list)
    created: list[str] = field(default_factory=list)
    repaired: dict[str, str] = field(default_factory=dict)
    removed: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def make_host(config: LabConfig, pool: str, index: int) -> Host:
    name = config.host_name(index)
    return Host(name=name, index=index, address=host_address(pool, index), host_dir=config.host_dir(name))


def our_veths(config: LabConfig) -> list[str]:
    pattern = re.compile(rf"ve-{re.escape(config.prefix)}-[0-9]+")
    return [link for link in network.list_links() if pattern.fullmatch(link)]


def existing_indexes(config: LabConfig) -> set[int]:
    """Indexes of hosts with any trace: a directory, a namespace or a veth (orphans of a crashed run too)."""
    names = [path.name for path in config.hosts_dir.iterdir()] if config.hosts_dir.is_dir() else []
    names += network.list_netns()
    names += [veth.removeprefix("ve-") for veth in our_veths(config)]
    return {index for name in names if (index := config.host_index(name)) is not None}


def host_problems(config: LabConfig, host: Host) -> list[str]:
    """Why a host is not healthy; empty when it runs, is networked and systemd answers over SSH."""
    problems = []
    if not is_alive(host.supervisor()):
        problems.append("supervisor not running")
    if not is_alive(host.nspawn()):
        problems.append("systemd-nspawn not running")
    if not network.host_network_ok(host.name, config.veth_name(host.index), host.address):
        problems.append("network namespace or veth missing")
    if problems:
        return problems
    probe = hostlib.probe(config, host)
    if not probe.reachable:
        return [f"ssh: {probe.detail or 'no answer'}"]
    if probe.state not in ("running", "degraded"):
        return [f"systemd is {probe.state}"]
    return []


def stop_host(config: LabConfig, name: str, index: int) -> list[str]:
    """Stops a host's processes and removes its network and nspawn locks; keeps its directory."""
    host_dir = config.host_dir(name)
    rootfs_dir = host_dir / "rootfs"
    recorded = [read_pid_file(host_dir / f) for f in ("supervisor.pid", "nspawn.pid")]
    records = [record for record in recorded if is_alive(record)]
    # Processes a crashed run started but never recorded carry the host's paths as arguments.
    for orphan in pids_with_argument({str(host_dir), f"--directory={rootfs_dir}"}):
        if orphan not in records:
            records.append(orphan)
    done = [f"stopped pid {record.pid}" for record in records]
    # The supervisor goes first: it passes SIGTERM to nspawn, which powers the container off cleanly.
    survivors = stop_processes(records, grace=HOST_STOP_SECONDS)
    if survivors:
        raise GpufleetError(f"{name}: processes {[r.pid for r in survivors]} did not exit; kill them and retry")
    lock_files = locks.lock_files_for(rootfs_dir)
    if locks.wait_released(lock_files, LOCK_RELEASE_SECONDS):
        raise GpufleetError(f"{name}: nspawn's lock on {rootfs_dir} was not released; retry `gpufleet lab down`")
    done += [f"removed lock {path.name}" for path in locks.remove_released(lock_files)]
    for pid_file in ("supervisor.pid", "nspawn.pid"):
        (host_dir / pid_file).unlink(missing_ok=True)
    done += network.delete_host_network(name, config.veth_name(index))
    return done


def remove_host(config: LabConfig, name: str, index: int) -> list[str]:
    done = stop_host(config, name, index)
    if config.host_dir(name).exists():
        hostlib.remove_host_dir(config.host_dir(name))
        done.append("removed its directory")
    return done


def remove_hosts(config: LabConfig, indexes: list[int]) -> list[str]:
    """Removes these hosts concurrently; one line per host saying what was removed."""

    def remove(index: int) -> str:
        name = config.host_name(index)
        return f"{name}: {', '.join(remove_host(config, name, index)) or 'nothing left to remove'}"

    return in_parallel(remove, indexes)


@dataclass(frozen=True)
class Image:
    """A release's cached root file system and the hash hosts made from it record."""

    release: OsRelease
    path: Path
    hash: str


def start_host(config: LabConfig, host: Host, image: Image) -> None:
    if not hostlib.rootfs_ready(host, image.hash):
        hostlib.create_rootfs(host, image.path, image.hash, image.release)
    hostlib.configure_rootfs(host, config, mirror.host_mirror_url(host.address), image.release)
    network.create_host_network(host.name, config.veth_name(host.index), host.address)
    hostlib.start_supervisor(host)


def mirror_addresses(pool: str) -> list[str]:
    """The gateway of every host the lab could have: resizing the lab then never restarts the mirror
    (it binds with IP_FREEBIND, so gateways of hosts not created yet are fine)."""
    return [str(host_address(pool, index).gateway) for index in range(1, preflight.HARD_CAP + 1)]


def prepare_keys(config: LabConfig, hosts: list[Host]) -> None:
    keys.generate_key(config.private_key, f"gpufleet-lab-{config.prefix}")
    entries = []
    for host in hosts:
        host_key = hostlib.host_key_path(config, host.name)
        keys.generate_key(host_key, f"root@{host.name}")
        entries.append(keys.known_hosts_line([str(host.address.host), host.name], keys.public_key(host_key)))
    keys.write_known_hosts(config.known_hosts, entries)


def bring_up(config: LabConfig, host: Host, image: Image) -> tuple[str, str]:
    """Leaves a healthy host of the wanted image alone, repairs a broken one, rebuilds one of another OS or
    recipe, creates a missing one: returns (what, why)."""
    existed = host.host_dir.exists() or network.netns_exists(host.name)
    problems = host_problems(config, host) if existed else []
    if existed and not hostlib.rootfs_ready(host, image.hash):
        problems.append(f"not made from the {image.release.label} image {image.hash[:12]}")
    if existed and not problems:
        return "unchanged", ""
    cleaned = stop_host(config, host.name, host.index) if existed else []
    start_host(config, host, image)
    return ("repaired", "; ".join(problems + cleaned)) if existed else ("created", "")


def in_parallel(function: Callable[[T], R], items: list[T]) -> list[R]:
    """Runs `function` on every item at once (hosts boot, stop and unpack concurrently); keeps order."""
    if not items:
        return []
    with ThreadPoolExecutor(max_workers=len(items)) as executor:
        return list(executor.map(function, items))


def ensure_images(config: LabConfig, releases: Sequence[OsRelease], result: UpResult) -> dict[str, Image]:
    """Each release's image by name, built first where its cache entry is missing."""
    wanted = {release.name: release for release in releases}
    if any(not rootfs.cached_tar(config.rootfs_cache_dir, release).is_file() for release in wanted.values()):
        preflight.require_tools(preflight.BUILD_TOOLS)
    images = {}
    for name, release in wanted.items():
        path, built = rootfs.ensure_rootfs(config.rootfs_cache_dir, release)
        if built:
            result.notes.append(f"built the {release.label} root file system image {path.name}")
        images[name] = Image(release, path, rootfs.image_hash(release))
    return images


def kept_releases(hosts: list[Host]) -> list[OsRelease]:
    """Without --os every host keeps the OS it was made with (a new one gets the default), so a plain `lab up`
    (molecule's create step, a resize) never turns a mixed lab into another."""
    return [RELEASES.get(hostlib.recorded_os(host) or DEFAULT_OS, RELEASES[DEFAULT_OS]) for host in hosts]


def up(config: LabConfig, count: int, timeout: float, releases: Sequence[OsRelease] | None = None) -> UpResult:
    """Brings the lab to exactly `count` healthy hosts plus the mirror, repairing what is broken; host i runs
    releases[(i - 1) % len(releases)], or the OS it already has when releases is None."""
    # Input first, then the environment: a wrong --hosts is reported even to a non-root user.
    preflight.validate_host_count(count, preflight.max_hosts(preflight.memory_total_bytes()))
    preflight.require_root()
    preflight.require_tools(preflight.REQUIRED_TOOLS)
    result = UpResult()
    with state.locked(config.lock_file):
        saved = state.load(config.state_file)
        pool = pools.claim_pool(config, preferred=saved.get("pool"), ignore_interfaces=our_veths(config))
        if saved.get("pool") and saved["pool"] != pool:
            result.notes.append(f"address range {saved['pool']} is now in use on this machine; moved to {pool}")
            remove_hosts(config, sorted(existing_indexes(config)))

        extra = sorted(i for i in existing_indexes(config) if i > count)
        remove_hosts(config, extra)
        result.removed += [config.host_name(index) for index in extra]

        hosts = [make_host(config, pool, index) for index in range(1, count + 1)]
        host_oses = host_releases(releases, count) if releases else kept_releases(hosts)
        images = ensure_images(config, host_oses, result)
        prepare_keys(config, hosts)
        host_images = {host.name: images[release.name] for host, release in zip(hosts, host_oses)}
        outcomes = in_parallel(lambda host: bring_up(config, host, host_images[host.name]), hosts)
        started = []
        for host, (what, why) in zip(hosts, outcomes):
            if what == "unchanged":
                result.unchanged.append(host.name)
                continue
            started.append(host)
            if what == "repaired":
                result.repaired[host.name] = why
            else:
                result.created.append(host.name)

        # After the hosts' links exist: the mirror's health check goes to the first gateway address.
        mirror_action = mirror.ensure_running(config, mirror_addresses(pool), MIRROR_PORT)
        if mirror_action != "running":
            result.notes.append(f"mirror {mirror_action}")

        for host in started:
            probe = hostlib.wait_ready(config, host, timeout)
            if probe.state == "degraded":
                result.notes.append(f"{host.name} is degraded; failed units:\n{hostlib.failed_units(config, host)}")

        # The front door a production fleet has: a load balancer following every host's /health.
        balancer_action = balancer.ensure_running(
            config,
            str(hosts[0].address.gateway),
            [balancer.Backend(host.name, str(host.address.host)) for host in hosts],
        )
        if balancer_action != "running":
            result.notes.append(f"balancer {balancer_action}: {balancer.url(str(hosts[0].address.gateway))}")

        # The first two hosts form the lab's Ray cluster, on a link of their own.
        cluster = hosts[:2] if len(hosts) >= 2 else []
        if cluster and network.ensure_cluster_link(cluster[0].name, cluster[1].name):
            result.notes.append(f"cluster link {cluster[0].name} <-> {cluster[1].name} made")
        cluster_addresses = dict(zip((h.name for h in cluster), network.CLUSTER_ADDRESSES))
        rows = [
            inventory.InventoryHost(
                h.name,
                str(h.address.host),
                mirror.host_mirror_url(h.address),
                host_images[h.name].release.name,
                rootfs.python_interpreter(h.rootfs),
                cluster_addresses.get(h.name, ""),
            )
            for h in hosts
        ]
        inventory.write(config.inventory_path, inventory.render(config, rows))
    return result


@dataclass(frozen=True)
class HostStatus:
    name: str
    address: str
    up: bool
    state: str
    boot_id: str
    boot_age_seconds: int


def status(config: LabConfig) -> tuple[list[HostStatus], mirror.MirrorStatus]:
    """The state of every host of the lab (read-only: takes no lock, changes nothing)."""
    # The lab's SSH key and known_hosts are root's; without them every host would look down.
    preflight.require_root()
    saved = state.load(config.state_file)
    pool = saved.get("pool")
    rows = []
    for index in sorted(existing_indexes(config)):
        if pool is None:
            rows.append(HostStatus(config.host_name(index), "?", False, "no lab state", "", 0))
            continue
        host = make_host(config, pool, index)
        problems = host_problems(config, host)
        probe = hostlib.probe(config, host) if not problems else None
        rows.append(
            HostStatus(
                name=host.name,
                address=str(host.address.host),
                up=not problems,
                state=probe.state if probe else "; ".join(problems),
                boot_id=probe.boot_id if probe else "",
                boot_age_seconds=probe.boot_age_seconds if probe else 0,
            )
        )
    return rows, mirror.status(config)


def down(config: LabConfig) -> list[str]:
    """Removes every host, namespace, veth, lock and process of the lab; keeps the caches and SSH keys."""
    preflight.require_root()
    preflight.require_tools({"ip": "iproute2"})
    done = []
    with state.locked(config.lock_file):
        pools.check_owner(config)
        done += remove_hosts(config, sorted(existing_indexes(config)))
        done += mirror.stop(config)
        done += balancer.stop(config)
        leftovers = verify_gone(config)
        if leftovers:
            raise GpufleetError(f"lab down left {', '.join(leftovers)}; run `gpufleet lab down` again")
        config.state_file.unlink(missing_ok=True)
        pools.release(config)
        if config.inventory_path.is_file():
            config.inventory_path.unlink()
            done.append(f"removed {config.inventory_path.name}")
        config.lock_file.unlink(missing_ok=True)
    return done


def verify_gone(config: LabConfig) -> list[str]:
    """Anything of this lab that still exists after tear-down."""
    leftovers = [f"netns {name}" for name in network.list_netns() if config.host_index(name) is not None]
    leftovers += [f"veth {veth}" for veth in our_veths(config)]
    if config.hosts_dir.is_dir() and any(config.hosts_dir.iterdir()):
        leftovers.append(f"host directories in {config.hosts_dir}")
    if mirror.status(config).running:
        leftovers.append("the mirror process")
    if balancer.status(config).running:
        leftovers.append("the balancer process")
    return leftovers
