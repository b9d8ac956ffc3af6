"""The launcher of a headless member of an instance across nodes (role vllm_service,
files/vllm-headless-member.py): it finds its connection to the leader's rendezvous store in the kernel's table and
gives up on the leader only once that connection was up and has been gone for the grace period."""

from __future__ import annotations

import importlib.util
import ipaddress
import socket
import sys
from types import ModuleType

from test_ray_cluster_info import VLLM_ROLE

LAUNCHER = VLLM_ROLE / "files" / "vllm-headless-member.py"
# /proc/net/tcp6 lines (header, then sl local remote st ...): a connection of 10.254.0.2 to ::ffff:10.254.0.1:29500
# (29500 = 0x733C) established, and one to 10.254.0.1:29500 closing (state 08, CLOSE_WAIT).
TCP6 = (
    "  sl  local_address                         remote_address                        st tx_queue rx_queue\n"
    "   0: 0000000000000000FFFF00000200FE0A:890C 0000000000000000FFFF00000100FE0A:733C 01 00000000:00000000\n"
    "   1: 0000000000000000FFFF00000200FE0A:890D 0000000000000000FFFF00000100FE0A:733D 08 00000000:00000000\n"
)
LEADER = (ipaddress.ip_address("10.254.0.1"), 29500)


def launcher() -> ModuleType:
    spec = importlib.util.spec_from_file_location("vllm_headless_member", LAUNCHER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_an_ipv4_peer_of_an_ipv6_socket_is_read_as_ipv4_and_only_established_ones_count() -> None:
    assert launcher().established_peers(TCP6) == {LEADER}


def test_a_real_connection_is_found_in_the_kernels_table() -> None:
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)), server.accept()[0]:
            assert (ipaddress.ip_address("127.0.0.1"), port) in launcher().read_peers()


def watched(seen: list[bool]) -> tuple[bool, float]:
    """Whether watch_leader gave up on a leader whose connection is up at each poll as `seen` says (then gone),
    and at which time of a clock that the polls advance."""
    member = launcher()
    polls = iter(seen)
    now = [0.0]

    def peers() -> set[tuple[object, int]]:
        return {LEADER} if next(polls, False) else set()

    def sleep(seconds: float) -> None:
        now[0] += seconds
        if now[0] > 600:
            raise TimeoutError

    try:
        member.watch_leader(LEADER, peers=peers, sleep=sleep, clock=lambda: now[0])
    except TimeoutError:
        return False, now[0]
    return True, now[0]


def test_a_member_waits_for_its_leader_as_long_as_it_takes_before_the_first_connection() -> None:
    assert watched([False] * 200) == (False, 605.0)


def test_a_member_gives_up_once_the_connection_is_gone_for_the_grace_period() -> None:
    gave_up, at = watched([False, False, True, True, True])
    # Up at polls 3-5 (t 10-20 s), gone from t 25 s: given up 15 s later.
    assert (gave_up, at) == (True, 40.0)


def test_a_connection_that_comes_back_within_the_grace_period_is_kept() -> None:
    # Gone at t 5-10 s (under the grace period), up at 15 s, gone from 20 s: given up at 35 s, not at 20 s.
    assert watched([True, False, False, True, False, False, False, False]) == (True, 35.0)
