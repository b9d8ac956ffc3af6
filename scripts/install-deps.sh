#!/usr/bin/env bash
# Installs the Debian packages the controller needs, only when one is missing (idempotent, fast when warm).
set -euo pipefail

packages=(
  systemd-container  # systemd-nspawn: boots the lab hosts
  mmdebstrap         # builds the lab hosts' Debian root file system
  makeself           # self-extracting lab stand-ins for NVIDIA's .run installers
  iproute2           # network namespaces and veth pairs for the lab
  openssh-client     # the controller reaches lab hosts over SSH
  gcc make libc6-dev # the simulated NVML library is compiled in C
  curl ca-certificates
  openssl            # the lab CA and host certificates
  haproxy            # the lab's load balancer in front of the hosts' proxies (gpufleet/lab/balancer.py)
  chromium           # headless: tests/unit/test_report_html.py screenshots `gpufleet drift --html`'s page
  ninja-build        # tests/unit/test_compile_cache.py: a shipped flashinfer-style JIT cache that ninja finds up to date
)

# Some tests fetch a package file with `apt-get download`: that needs package lists, even when nothing is missing.
lists_present() { compgen -G '/var/lib/apt/lists/*_Packages*' >/dev/null; }

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done

if [ "${#missing[@]}" -eq 0 ] && lists_present; then
  exit 0
fi
if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: missing Debian packages (${missing[*]}); run as root or install them with apt-get." >&2
  exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get install -y -q --no-install-recommends "${missing[@]}"
fi
