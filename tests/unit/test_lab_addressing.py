"""Address allocation for lab hosts: /30 per host, a pool that avoids the machine's networks."""

from __future__ import annotations

import ipaddress

import pytest

from gpufleet.errors import GpufleetError
from gpufleet.lab.addressing import CANDIDATE_POOLS, MAX_INDEX, choose_pool, host_address, networks_in_use
from gpufleet.lab.mirror import host_mirror_url

net = ipaddress.IPv4Network


def test_host_one_gets_the_second_slash_30() -> None:
    address = host_address("10.213.7.0/24", 1)
    assert address.network == net("10.213.7.4/30")
    assert str(address.gateway) == "10.213.7.5"
    assert str(address.host) == "10.213.7.6"
    assert address.prefixlen == 30


def test_hosts_get_disjoint_links() -> None:
    links = [host_address("10.213.7.0/24", index).network for index in range(1, MAX_INDEX + 1)]
    assert len(set(links)) == MAX_INDEX
    assert not any(a.overlaps(b) for i, a in enumerate(links) for b in links[i + 1 :])


@pytest.mark.parametrize("index", [0, -1, MAX_INDEX + 1])
def test_index_out_of_range(index: int) -> None:
    with pytest.raises(ValueError):
        host_address("10.213.7.0/24", index)


def test_first_candidate_when_nothing_overlaps() -> None:
    assert choose_pool([net("192.0.2.0/24"), net("127.0.0.0/8")]) == CANDIDATE_POOLS[0]


def test_skips_a_pool_that_overlaps_a_route() -> None:
    # A wide corporate route covering the first candidates forces a later one.
    assert choose_pool([net("10.213.0.0/16")]) == "172.29.213.0/24"


def test_keeps_the_preferred_pool_while_free() -> None:
    assert choose_pool([net("192.0.2.0/24")], preferred="10.213.9.0/24") == "10.213.9.0/24"


def test_leaves_the_preferred_pool_once_taken() -> None:
    assert choose_pool([net("10.213.9.0/24")], preferred="10.213.9.0/24") == CANDIDATE_POOLS[0]


def test_no_free_pool_is_an_error() -> None:
    with pytest.raises(GpufleetError, match="overlaps"):
        choose_pool([net("0.0.0.0/1"), net("128.0.0.0/1")])


def test_networks_in_use_reads_this_machine() -> None:
    used = networks_in_use()
    assert used, "every machine has at least a loopback network"
    assert all(isinstance(item, ipaddress.IPv4Network) for item in used)
    assert any(item.is_loopback for item in used)


def test_networks_in_use_ignores_named_interfaces() -> None:
    assert not any(item.is_loopback for item in networks_in_use(ignore_interfaces=["lo"]))


def test_mirror_url_is_the_hosts_gateway() -> None:
    assert host_mirror_url(host_address("10.213.7.0/24", 2), 8780) == "http://10.213.7.9:8780"
