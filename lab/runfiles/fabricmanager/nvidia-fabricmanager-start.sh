#!/bin/bash
# LAB-STANDIN: gpufleet's lab stand-in for NVIDIA's nvidia-fabricmanager-start.sh (not NVIDIA software): the
# unit's ExecStartPre (--mode precheck) and ExecStart (--mode start, which starts nv-fabricmanager with the
# config file and returns once it has forked, as on a Pre-NVL5 HGX system).
set -u
mode=""
config=/usr/share/nvidia/nvswitch/fabricmanager.cfg
while [ $# -gt 0 ]; do
    case "$1" in
        --mode) mode="${2:-}"; shift ;;
        --fm-config-file) config="${2:-}"; shift ;;
        *) echo "nvidia-fabricmanager-start.sh: unknown option '$1'" >&2; exit 1 ;;
    esac
    shift
done
case "$mode" in
    precheck) [ -x /usr/bin/nv-fabricmanager ] || { echo "nv-fabricmanager is not installed" >&2; exit 1; } ;;
    start) echo "Detected Pre-NVL5 system (LAB-STANDIN)"; exec /usr/bin/nv-fabricmanager -c "$config" ;;
    *) echo "nvidia-fabricmanager-start.sh: --mode precheck|start" >&2; exit 1 ;;
esac
