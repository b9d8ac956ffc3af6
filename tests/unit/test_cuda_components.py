"""cuda_components.csv (issue 36): the CUDA Runtime (cudart) and CUDA NVCC version of every CUDA toolkit release
from 11.8.0 on, each row read from NVIDIA: a release's "CUDA Toolkit Release Notes" component table, its redist
manifest (developer.download.nvidia.com/compute/cuda/redist/redistrib_<release>.json) or its version manifest
(developer.download.nvidia.com/compute/cuda/repos/<distro>/<arch>/version_<release>.json). A component version
written where a toolkit release belongs (torch's nvidia-cuda-runtime-cu12==12.8.90 pin, nvcc's 12.4.131) is
refused with the release that ships it and that release's runfile.
"""

from __future__ import annotations

import csv

import pytest

from gpufleet import PROJECT_ROOT, compat

from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_links import driver_runs_cuda
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_report import Report
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_versions import version_key
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_artifacts, stack_declared

KB = compat.load_knowledge_base()
KB_DIR = PROJECT_ROOT / "data" / "compat"
CUDART, NVCC = "CUDA Runtime (cudart)", "CUDA NVCC"

# Every release 11.8.0..13.5.0 whose cudart and nvcc versions were read from NVIDIA. 12.9.2 and 13.0.3 are NVIDIA
# releases (version_12.9.2.json, version_13.0.3.json; torch pins cuda-toolkit==13.0.3) that cuda_driver.csv
# does not list yet.
BOTH = [
    "11.8.0",
    "12.0.0",
    "12.0.1",
    "12.1.1",
    "12.2.0",
    "12.2.1",
    "12.2.2",
    "12.3.0",
    "12.3.2",
    "12.4.0",
    "12.4.1",
    "12.5.0",
    "12.5.1",
    "12.6.0",
    "12.6.3",
    "12.8.0",
    "12.8.1",
    "12.9.0",
    "12.9.1",
    "12.9.2",
    "13.0.0",
    "13.0.1",
    "13.0.2",
    "13.0.3",
    "13.1.1",
    "13.1.2",
    "13.2.0",
    "13.2.1",
    "13.2.2",
    "13.3.0",
    "13.3.1",
    "13.4.1",
    "13.4.2",
    "13.5.0",
]
# cudart read from NVIDIA, nvcc not found in a primary source yet.
CUDART_ONLY = ["12.1.0", "12.3.1"]
# Neither found in a primary source yet (no row): 12.6.1, 12.6.2, 13.1.0, 13.4.0.
NOT_IN_DRIVER_TABLE = {"12.9.2", "13.0.3"}


def rows() -> list:
    with (KB_DIR / "cuda_components.csv").open(newline="", encoding="utf-8") as handle:
        return list(csv.DictReader(handle))


def validate(**overrides) -> dict:
    raw = {
        "gpu": ["NVIDIA H100 80GB HBM3"],
        "driver": "580.95.05",
        "cuda": "12.8",
        "python": "3.12",
        "torch": "2.7.0",
        "torch_variant": "cu128",
        "vllm": None,
    }
    raw.update(overrides)
    return stack_declared.validate_stack(stack_spec.normalize_stack(raw), KB)


def cuda_errors(report: dict) -> list:
    return [error["message"] for error in report["errors"] if error["link"] == "cuda"]


@pytest.mark.parametrize(
    "version,component,releases",
    [
        # redistrib_12.4.1.json: cuda_cudart 12.4.127, cuda_nvcc 12.4.131 (torch 2.5-2.6 pin cudart 12.4.127)
        ("12.4.127", CUDART, ["12.4.1"]),
        ("12.4.131", NVCC, ["12.4.1"]),
        # version_12.8.1.json: cuda_cudart 12.8.90, cuda_nvcc 12.8.93 (torch's cu128 wheels pin cudart 12.8.90)
        ("12.8.90", CUDART, ["12.8.1"]),
        ("12.8.93", NVCC, ["12.8.1"]),
        # CUDA 11.8 release notes, Table 1: CUDA Runtime (cudart) 11.8.89, CUDA NVCC 11.8.89
        ("11.8.89", CUDART, ["11.8.0"]),
        ("11.8.89", NVCC, ["11.8.0"]),
        # CUDA 12.6 Update 3 release notes, Table 1: cudart 12.6.77; redistrib_12.6.3.json: cuda_nvcc 12.6.85
        ("12.6.77", CUDART, ["12.6.3"]),
        ("12.6.85", NVCC, ["12.6.3"]),
        # redistrib_13.0.1.json and redistrib_13.0.2.json both carry cuda_nvcc 13.0.88; cudart moved to 13.0.96
        ("13.0.88", NVCC, ["13.0.1", "13.0.2", "13.0.3"]),
        ("13.0.96", CUDART, ["13.0.2", "13.0.3"]),
    ],
)
def test_rows_match_nvidias_manifests(version, component, releases):
    found = [
        row["cuda_version"] for row in rows() if row["component_version"] == version and row["component"] == component
    ]
    assert found == releases


def test_every_release_has_cudart_and_nvcc():
    have = {(row["cuda_version"], row["component"]) for row in rows()}
    missing = [
        (release, component) for release in BOTH for component in (CUDART, NVCC) if (release, component) not in have
    ]
    missing += [(release, CUDART) for release in CUDART_ONLY if (release, CUDART) not in have]
    assert not missing
    assert {row["cuda_version"] for row in rows()} == set(BOTH) | set(CUDART_ONLY)
    assert len(rows()) == len({(row["cuda_version"], row["component"]) for row in rows()})


@pytest.mark.parametrize("component", [CUDART, NVCC])
def test_versions_increase_with_releases(component):
    ordered = sorted(
        (row for row in rows() if row["component"] == component), key=lambda row: version_key(row["cuda_version"])
    )
    for older, newer in zip(ordered, ordered[1:]):
        assert version_key(older["component_version"]) <= version_key(newer["component_version"]), (older, newer)
    for row in ordered:
        assert row["component_version"].split(".")[:2] == row["cuda_version"].split(".")[:2], row


def test_each_row_cites_a_source_and_names_a_known_release():
    releases = {row["cuda_version"]: row for row in KB["cuda"]}
    for row in rows():
        assert row["source"].startswith(("https://", "NVIDIA CUDA Toolkit Release Notes")), row
        assert "https://" in row["source"], row
        assert row["component_version"] in row["source"], row
        if row["cuda_version"] in NOT_IN_DRIVER_TABLE:
            assert row["cuda_version"] not in releases
            assert row["cuda_release"] == "CUDA " + row["cuda_version"]
            continue
        driver_row = releases[row["cuda_version"]]
        if "(" not in driver_row["cuda_release"]:
            assert row["cuda_release"] == driver_row["cuda_release"], row


def test_every_cudart_pin_of_torch_is_named_with_its_release():
    index = KbIndex(KB)
    pins = {row["pypi_cuda_runtime_pin"] for row in KB["torch"]}
    cudart = sorted(pin.split("==")[1] for pin in pins if pin.startswith("nvidia-cuda-runtime-cu12=="))
    assert cudart == ["12.1.105", "12.4.127", "12.6.77", "12.8.90"]
    for version in cudart:
        assert index.name_component(version).startswith(CUDART + " inside CUDA "), version


def test_a_cudart_version_that_was_unknown_is_refused_with_its_release_and_runfile():
    """Before issue 36 the table had no 12.8.90: `cuda: "12.8.90"` (torch 2.7's cudart pin) was refused as
    'CUDA toolkit 12.8.90 is not in the knowledge base'."""
    messages = cuda_errors(validate(cuda="12.8.90"))
    assert messages == [
        "CUDA 12.8.90 is not a toolkit release: 12.8.90 is the version of CUDA Runtime (cudart) inside CUDA 12.8 "
        'Update 1 (toolkit 12.8.1, runfile cuda_12.8.1_570.124.06_linux.run) — set cuda: "12.8.1"'
    ]
    assert not any("not in the knowledge base" in message for message in messages)


def test_an_nvcc_version_is_refused_with_its_release():
    messages = cuda_errors(validate(cuda="12.4.131", driver="550.54.15", torch="2.5.1", torch_variant="cu124"))
    assert len(messages) == 1
    assert (
        "CUDA NVCC inside CUDA 12.4 Update 1 (toolkit 12.4.1, runfile cuda_12.4.1_550.54.15_linux.run)" in messages[0]
    )
    assert messages[0].endswith('set cuda: "12.4.1"')


def test_a_version_of_two_components_and_releases_names_each():
    """13.0.88 is cudart of 13.0.1 and nvcc of 13.0.1, 13.0.2 and 13.0.3; only 13.0.1 and 13.0.2 can be declared."""
    report = validate(cuda="13.0.88", driver="580.95.05", torch="2.9.0", torch_variant="cu130")
    (message,) = cuda_errors(report)
    assert (
        "13.0.88 is the version of CUDA Runtime (cudart) inside CUDA 13.0 Update 1 (toolkit 13.0.1, runfile "
        "cuda_13.0.1_580.82.07_linux.run) and of CUDA NVCC inside CUDA 13.0 Update 1 (toolkit 13.0.1, runfile "
        "cuda_13.0.1_580.82.07_linux.run), CUDA 13.0 Update 2 (toolkit 13.0.2, runfile "
        "cuda_13.0.2_580.95.05_linux.run), CUDA 13.0.3 (toolkit 13.0.3)"
    ) in message
    assert message.endswith('set cuda: "13.0.1" or "13.0.2"')
    cited = [fact for fact in report["facts"] if fact["id"].startswith("cuda-component:13.0.88:")]
    assert len(cited) == 4 and all("https://" in fact["source"] for fact in cited)


def test_the_other_refusals_name_the_release_too():
    with pytest.raises(stack_artifacts.ArtifactError, match=r"inside CUDA 12\.6 Update 3 \(toolkit 12\.6\.3, runfile"):
        stack_artifacts.toolkit_row(KB, "12.6.77")
    report = Report()
    driver_runs_cuda(KbIndex(KB), report, "560.35.05", "12.6.85", "the toolkit", "driver -> cuda", "fix")
    (error,) = report.errors
    assert "12.6.85 is the version of CUDA NVCC inside CUDA 12.6 Update 3 (toolkit 12.6.3" in error["message"]


def test_an_unknown_version_is_still_refused_as_unknown():
    assert cuda_errors(validate(cuda="12.8.999")) == [
        "CUDA toolkit 12.8.999 is not in the knowledge base (data/compat/cuda_driver.csv) — use a listed release "
        "or add its sourced row"
    ]
