"""The lab fleet: Debian 12 hosts booted with systemd-nspawn, reachable over SSH, plus an artifact mirror.

Entry points: `gpufleet.lab.fleet` (up/status/down) and `gpufleet.lab.mirror` (the mirror's small API).
"""
