"""Knowledge base, round three (issue 36 part 1): every GPU of NVIDIA's CUDA GPUs pages with its compute capability.

Facts checked here, each from the page it is read from:
- https://developer.nvidia.com/cuda-gpus ("CUDA GPU Compute Capability", stored copy): GeForce RTX 4060 and
  NVIDIA RTX 2000 Ada 8.9, NVIDIA RTX A4000 and NVIDIA A16 8.6, Jetson AGX Orin 8.7, NVIDIA GB10 (DGX Spark) 12.1,
  Jetson T5000 11.0, NVIDIA RTX PRO 4000 Blackwell 12.0; beyond the stored excerpt (a third-party copy of the same
  table, corroborated by a 2024 scrape): NVIDIA A30 8.0, Quadro RTX 8000 7.5.
- https://developer.nvidia.com/cuda-legacy-gpus ("Legacy CUDA GPU Compute Capability", stored copy): Tesla P100 6.0,
  Tesla P40 6.1, NVIDIA V100 7.0, Tesla M60 5.2, Jetson TX2 6.2; beyond the excerpt: Tesla K80 3.7, Tesla K10 3.0.
- https://docs.nvidia.com/datacenter/tesla/drivers/cuda-toolkit-driver-and-architecture-matrix.html: Maxwell, Pascal
  and Volta last CUDA 12.x, Kepler 3.5/3.7 last CUDA 11.x; the CUDA 13.0 features archive: "CUDA 13.0 supports all
  NVIDIA architectures from Turing through Grace Blackwell".
- torch_arch_lists.csv: torch 2.5.1+cu124's arch list starts at sm_50, torch 2.11.0+cu130's at sm_75.
"""

from __future__ import annotations

import csv

import pytest

from gpufleet import PROJECT_ROOT, compat

from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_declared

from test_stack_chain import stack

KB = compat.load_knowledge_base()
KB_DIR = PROJECT_ROOT / "data" / "compat"

# The rows of gpus.csv before this round (issue 14 and earlier): their names must resolve as they did.
EARLIER_GPUS = [
    "NVIDIA T4",
    "NVIDIA A10",
    "NVIDIA A10G (AWS G5)",
    "NVIDIA L4",
    "NVIDIA L40S",
    "NVIDIA A100",
    "NVIDIA H100",
    "NVIDIA H200",
    "NVIDIA B200",
    "GeForce RTX 3090",
    "GeForce RTX 4090",
    "GeForce RTX 5090",
    "NVIDIA GH200",
    "NVIDIA L40",
    "NVIDIA RTX 6000 Ada Generation",
    "NVIDIA A40",
    "NVIDIA GB200",
    "NVIDIA B300",
    "NVIDIA GB300",
    "NVIDIA RTX PRO 6000 Blackwell",
    "NVIDIA H20",
]


# torch 2.5.1+cu124 (arch list sm_50 ... sm_90) with the CUDA 12.4 toolkit and its driver.
CU124 = {"driver": "550.54.14", "cuda": "12.4", "torch": "2.5.1", "torch_variant": "cu124"}


def validate(raw):
    return stack_declared.validate_stack(stack_spec.normalize_stack(raw), KB)


def gpu_rows():
    with open(KB_DIR / "gpus.csv", newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


@pytest.mark.parametrize(
    "entry,cc",
    [
        ("NVIDIA GeForce RTX 4060", "8.9"),
        ("NVIDIA GeForce RTX 4060 Ti", "8.9"),
        ("NVIDIA RTX 2000 Ada Generation", "8.9"),
        ("NVIDIA RTX 4000 SFF Ada Generation", "8.9"),
        ("NVIDIA RTX A4000", "8.6"),
        ("NVIDIA A16", "8.6"),
        ("NVIDIA GeForce RTX 3060", "8.6"),
        ("Jetson AGX Orin", "8.7"),
        ("NVIDIA GB10", "12.1"),
        ("Jetson T5000", "11.0"),
        ("NVIDIA RTX PRO 4000 Blackwell", "12.0"),
        ("NVIDIA GeForce RTX 5070 Ti", "12.0"),
        ("NVIDIA A30", "8.0"),
        ("Quadro RTX 8000", "7.5"),
        ("Tesla P100-PCIE-16GB", "6.0"),
        ("Tesla P40", "6.1"),
        ("Tesla V100-SXM2-32GB", "7.0"),
        ("Tesla M60", "5.2"),
        ("Tesla K80", "3.7"),
        ("Tesla K10", "3.0"),
        ("NVIDIA TITAN Xp", "6.1"),
        ("NVIDIA GeForce GTX TITAN X", "5.2"),
        ("NVIDIA GeForce GTX 1080 Ti", "6.1"),
    ],
)
def test_gpus_of_nvidias_pages_resolve_to_their_compute_capability(entry, cc):
    """Names that were 'not in the knowledge base' now resolve, with the page's compute capability."""
    gpu = KbIndex(KB).resolve_gpu(entry)
    assert gpu is not None, entry
    assert gpu["cc"] == cc


def test_every_earlier_row_still_resolves_to_itself():
    """No match string added in this round takes over a name that resolved before (longest token wins)."""
    rows = {row["gpu"]: row for row in gpu_rows()}
    index = KbIndex(KB)
    for name in EARLIER_GPUS:
        for token in [part for part in rows[name]["match"].split(";") if part.strip()]:
            for entry in (token, "NVIDIA " + token):
                assert index.resolve_gpu(entry)["label"] == name, (entry, index.resolve_gpu(entry)["label"])
        assert index.resolve_gpu(name)["label"] == name


def test_every_row_resolves_to_itself_and_names_are_unique():
    rows = gpu_rows()
    assert len({row["gpu"] for row in rows}) == len(rows)
    index = KbIndex(KB)
    for row in rows:
        for token in [part for part in row["match"].split(";") if part.strip()]:
            assert index.resolve_gpu(token)["label"] == row["gpu"], token


def test_every_row_is_sourced_and_its_compute_capability_known_or_said():
    ccs = {row["compute_capability"]: row for row in KB["compute_capabilities"]}
    for row in gpu_rows():
        assert row["source"].startswith("CC: "), row["gpu"]
        assert row["cc_status"] in ("verified", "corroborated", "unverified"), row["gpu"]
        if row["compute_capability"] in ccs:
            assert row["min_cuda"] == ccs[row["compute_capability"]]["min_cuda"], row["gpu"]
        else:
            assert row["compute_capability"] in ("6.2", "7.2") and not row["min_cuda"], row["gpu"]


def test_an_old_data_centre_gpu_below_the_wheels_arch_list_is_refused_naming_the_list():
    """Tesla K80 (3.7) with torch 2.5.1+cu124: the wheel's arch list starts at sm_50."""
    report = validate(stack(gpu=["Tesla K80"], **CU124))
    assert not any("not in the knowledge base" in error["message"] for error in report["errors"])
    messages = [error["message"] for error in report["errors"] if error["link"] == "torch -> gpu"]
    assert messages, report["errors"]
    assert "arch list: sm_50 sm_60 sm_70 sm_75 sm_80 sm_86 sm_90; it starts at sm_50, above sm_37" in messages[0]
    assert "Tesla K80 (sm_37)" in messages[0]


def test_a_pascal_gpu_on_a_cuda_13_wheel_is_refused_naming_cuda_13_and_the_list():
    report = validate(stack(gpu=["Tesla P100-PCIE-16GB"]))
    errors = {(error["link"], error["message"]) for error in report["errors"]}
    assert not any("not in the knowledge base" in message for _, message in errors)
    dropped = [message for link, message in errors if link == "gpu -> cuda"]
    assert any(
        "CUDA 13 dropped compute capability 6.0, whose last CUDA is CUDA 12.x" in message
        and "torch 2.11.0+cu130 uses CUDA 13.0" in message
        for message in dropped
    ), dropped
    arch = [message for link, message in errors if link == "torch -> gpu"]
    assert any("arch list: sm_75 sm_80 sm_86 sm_90 sm_100 sm_120; it starts at sm_75, above sm_60" in m for m in arch)


def test_kepler_on_cuda_12_names_cuda_12():
    report = validate(stack(gpu=["Tesla K80"], **CU124))
    assert any(
        error["link"] == "gpu -> cuda"
        and "CUDA 12 dropped compute capability 3.7, whose last CUDA is CUDA 11.x" in error["message"]
        for error in report["errors"]
    ), report["errors"]


def test_pascal_on_cuda_12_is_fine():
    """torch 2.5.1+cu124 compiles sm_60 and CUDA 12.x still supports Pascal."""
    report = validate(stack(gpu=["Tesla P100-PCIE-16GB"], **CU124))
    assert report["errors"] == [], report["errors"]


def test_turing_is_not_dropped_by_cuda_13():
    report = validate(stack(gpu=["Quadro RTX 8000"]))
    assert not [error for error in report["errors"] if error["link"].startswith("gpu")], report["errors"]


def test_a_known_gpu_without_a_sourced_first_cuda_says_so():
    """Jetson TX2 (6.2) is on the legacy page; NVIDIA's matrix gives no first CUDA for 6.2."""
    report = validate(stack(gpu=["Jetson TX2"]))
    messages = [error["message"] for error in report["errors"] if error["link"] == "gpu"]
    assert any("compute capability 6.2" in message and "compute_capabilities.csv" in message for message in messages)
    assert not any("is not in the knowledge base" in message for message in messages)
