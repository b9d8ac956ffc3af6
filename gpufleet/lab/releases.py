"""The operating systems a lab host can run: one Debian suite each, built by its own rootfs recipe."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from gpufleet.errors import GpufleetError


@dataclass(frozen=True)
class OsRelease:
    """A lab OS: its name on the command line, its Debian suite, how Ansible facts name it, and the paths of
    Debian's kernel packages its hosts leave out (dpkg path-exclude globs, as the packages name them)."""

    name: str
    suite: str
    distribution: str
    major: str
    unrun_kernel_paths: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.major}"

    @property
    def release_key(self) -> str:
        """The `<distribution>-<major>` key the roles' vars files and the supported-release list use."""
        return f"{self.distribution}-{self.major}"


# Only Debian suites: the lab machine reaches Debian's archive and no other (see the README's platform table).
# Lab hosts run the controller's kernel. Trixie's linux-headers-6.12.N+deb13-amd64 Depends on its
# linux-image-6.12.N+deb13-amd64 (bookworm's headers pull no image), so a Debian 13 host that installs the real
# headers installs (and the driver role holds) the image package too, as a real node does; its boot image and
# modules, which the container never runs, are left out: no vmlinuz in /boot for DKMS or drift to count.
RELEASES = {
    release.name: release
    for release in (
        OsRelease(name="debian12", suite="bookworm", distribution="Debian", major="12"),
        OsRelease(
            name="debian13",
            suite="trixie",
            distribution="Debian",
            major="13",
            unrun_kernel_paths=("/boot/vmlinuz-*", "/usr/lib/modules/*/kernel/*"),
        ),
    )
}
DEFAULT_OS = "debian12"


def parse_os_list(text: str) -> list[OsRelease]:
    """'debian12,debian13' -> the releases in that order; unknown or empty names are refused by name."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in RELEASES]
    if unknown:
        shown = ", ".join(repr(name) for name in unknown)
        raise GpufleetError(
            f"--os {shown}: the lab boots {', '.join(RELEASES)} (comma-separated, cycled over the hosts)"
        )
    return [RELEASES[name] for name in names]


def host_releases(releases: Sequence[OsRelease], count: int) -> list[OsRelease]:
    """The OS of hosts 1..count: the list cycled over the hosts (one name gives every host that OS)."""
    return [releases[index % len(releases)] for index in range(count)]
