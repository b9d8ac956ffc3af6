# Installed by gpufleet (role vllm_service). Runs a headless member of a vLLM instance across nodes (the
# instance's `nodes` after the first) with the instance's venv:  python vllm-headless-member.py VLLM-SERVE-ARGS
#
# vLLM starts a headless member only through its serve command (vllm/entrypoints/cli/serve.py), whose `vllm`
# script the CPU build cannot start; this runs that command's own parser and code, as `vllm serve --headless`
# would. A headless member watches only its own workers: when its leader goes away (stopped, crashed, restarted
# by systemd) it keeps waiting for work that never comes, and the restarted leader waits for it at the
# rendezvous forever. So this process also watches its connection to the leader's rendezvous store
# (--master-addr:--master-port): once that connection was up and has been gone for LEADER_GRACE_SECONDS, it
# exits with EXIT_LEADER_GONE, systemd starts the member again (Restart=on-failure), and it joins the leader's
# next rendezvous.
from __future__ import annotations

import ipaddress
import os
import sys
import threading
import time
from collections.abc import Callable

EXIT_LEADER_GONE = 75
LEADER_GRACE_SECONDS = 15
POLL_SECONDS = 5
ESTABLISHED = "01"
Endpoint = tuple[ipaddress.IPv4Address | ipaddress.IPv6Address, int]


def parse_endpoint(field: str) -> Endpoint:
    """One address of /proc/net/tcp or tcp6 ('0100007F:1F90'): the address in the kernel's byte order, 32 bits at
    a time, and the port in hex. An IPv4 peer of an IPv6 socket comes back as IPv4."""
    address_hex, port_hex = field.split(":")
    words = bytes.fromhex(address_hex)
    raw = b"".join(words[i : i + 4][::-1] for i in range(0, len(words), 4))
    address = ipaddress.ip_address(raw)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped, int(port_hex, 16)
    return address, int(port_hex, 16)


def established_peers(table: str) -> set[Endpoint]:
    """The remote endpoints of a /proc/net/tcp(6) table's established connections."""
    peers = set()
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == ESTABLISHED:
            peers.add(parse_endpoint(fields[2]))
    return peers


def read_peers() -> set[Endpoint]:
    peers: set[Endpoint] = set()
    for name in ("tcp", "tcp6"):
        try:
            with open(f"/proc/self/net/{name}", encoding="ascii") as table:
                peers |= established_peers(table.read())
        except FileNotFoundError:  # no IPv6 on this node
            continue
    return peers


def watch_leader(
    leader: Endpoint,
    peers: Callable[[], set[Endpoint]] = read_peers,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> None:
    """Returns once the connection to `leader` was up and has been gone for LEADER_GRACE_SECONDS."""
    seen_up = False
    gone_since: float | None = None
    while True:
        if leader in peers():
            seen_up, gone_since = True, None
        elif seen_up:
            gone_since = clock() if gone_since is None else gone_since
            if clock() - gone_since >= LEADER_GRACE_SECONDS:
                return
        sleep(POLL_SECONDS)


def exit_when_leader_gone(leader: Endpoint) -> None:
    watch_leader(leader)
    print(
        f"the leader's rendezvous store at {leader[0]}:{leader[1]} went away (the leader stopped or restarted): "
        "exiting so that systemd starts this member again and it joins the leader's next rendezvous",
        file=sys.stderr,
        flush=True,
    )
    os._exit(EXIT_LEADER_GONE)  # vLLM's shutdown would wait on the leader; systemd stops the workers


def main() -> None:
    from vllm.entrypoints.cli.serve import ServeSubcommand
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args()
    leader = (ipaddress.ip_address(args.master_addr), int(args.master_port))
    threading.Thread(target=exit_when_leader_gone, args=(leader,), daemon=True, name="leader-watch").start()
    ServeSubcommand.cmd(args)


if __name__ == "__main__":
    main()
