"""State the base role leaves on every lab host, read from the host itself."""

import pytest

BASE_PACKAGES = [
    "ca-certificates",
    "curl",
    "gnupg",
    "jq",
    "pciutils",
    "procps",
    "rsync",
    "tar",
    "xz-utils",
    "systemd-timesyncd",
]


@pytest.mark.parametrize("name", BASE_PACKAGES)
def test_base_package_installed(host, name: str) -> None:
    assert host.package(name).is_installed


def test_service_account_is_unprivileged(host) -> None:
    user = host.user("vllm")
    assert user.exists
    assert user.uid < 1000, "a system account"
    assert user.shell == "/usr/sbin/nologin"
    assert user.home == "/var/lib/vllm"
    assert user.group == "vllm"
    home = host.file("/var/lib/vllm")
    # The Ray cluster's sessions and sockets live there: the account's alone, as every instance has group vllm.
    assert home.is_directory and home.user == "vllm" and home.mode == 0o700


@pytest.mark.parametrize("path", ["/var/lib/gpufleet", "/var/log/gpufleet"])
def test_gpufleet_directories(host, path: str) -> None:
    directory = host.file(path)
    assert directory.is_directory and directory.user == "root" and directory.mode == 0o755


def test_time_sync_configured_and_enabled(host) -> None:
    conf = host.file("/etc/systemd/timesyncd.conf.d/gpufleet.conf")
    assert conf.contains("^NTP=0.debian.pool.ntp.org 1.debian.pool.ntp.org$")
    assert host.service("systemd-timesyncd").is_enabled


def test_sysctl_file_lists_every_setting(host) -> None:
    conf = host.file("/etc/sysctl.d/90-gpufleet.conf")
    assert conf.mode == 0o644
    for line in ("vm.max_map_count = 1048576", "vm.swappiness = 1", "net.core.somaxconn = 4096"):
        assert conf.contains(f"^{line}$")


def test_limits_for_the_service_account(host) -> None:
    limits = host.file("/etc/security/limits.d/90-gpufleet.conf")
    assert limits.contains("^vllm hard nofile 1048576$")
    assert limits.contains("^vllm hard memlock unlimited$")
