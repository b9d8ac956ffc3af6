"""Logic of the nvidia_runfile module: version parsing, flag building, the decision table, detection."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ansible_collections.gpufleet.fleet.plugins.module_utils import runfile
from ansible_collections.gpufleet.fleet.plugins.module_utils.runfile import RunfileError


@pytest.mark.parametrize(
    ("text", "expected"),
    [("580.95.05", (580, 95, 5)), ("12.8.1", (12, 8, 1)), ("535.104.05", (535, 104, 5)), (" 13.0 ", (13, 0))],
)
def test_parse_version(text: str, expected: tuple[int, ...]) -> None:
    assert runfile.parse_version(text) == expected


@pytest.mark.parametrize("text", ["", "580", "580.x", "v580.95.05", "580.95.05-1", None])
def test_parse_version_rejects_garbage(text: str | None) -> None:
    with pytest.raises(RunfileError, match="is not a version number"):
        runfile.parse_version(text)  # type: ignore[arg-type]


def test_numeric_not_lexical_ordering() -> None:
    assert runfile.parse_version("570.133.20") < runfile.parse_version("580.95.05")
    assert runfile.parse_version("535.104.05") > runfile.parse_version("535.54.03")


def test_toolkit_release() -> None:
    assert runfile.toolkit_release("12.8.1") == "12.8"
    assert runfile.toolkit_release("13.0.2") == "13.0"


@pytest.mark.parametrize(
    ("installed", "requested", "allow", "action"),
    [
        (None, "580.95.05", False, runfile.INSTALL),
        ("580.95.05", "580.95.05", False, runfile.NOTHING),
        ("570.133.20", "580.95.05", False, runfile.UPGRADE),
        ("580.95.05", "580.105.08", False, runfile.UPGRADE),
        ("580.95.05", "570.133.20", True, runfile.DOWNGRADE),
        ("12.8.0", "12.8.1", False, runfile.UPGRADE),
        ("12.8.1", "12.8.1", True, runfile.NOTHING),
    ],
)
def test_decision_table(installed: str | None, requested: str, allow: bool, action: str) -> None:
    assert runfile.decide(installed, requested, allow) == action


def test_downgrade_refused_names_both_versions_and_the_fix() -> None:
    with pytest.raises(RunfileError) as error:
        runfile.decide("580.95.05", "570.133.20", allow_downgrade=False)
    message = str(error.value)
    assert "580.95.05" in message and "570.133.20" in message and "allow_downgrade: true" in message


def test_driver_flags_for_a_current_branch() -> None:
    assert runfile.driver_flags("580.95.05") == [
        "--silent",
        "--dkms",
        "--kernel-module-type=open",
        "--no-opengl-files",
        "--no-x-check",
    ]


def test_driver_flags_before_r560_use_the_build_directory_flag() -> None:
    flags = runfile.driver_flags("550.144.03", kernel_module_type="open")
    assert "-m=kernel-open" in flags and not any(f.startswith("--kernel-module-type") for f in flags)
    assert "-m=kernel" in runfile.driver_flags("535.104.05", kernel_module_type="proprietary")


def test_driver_flags_every_option() -> None:
    flags = runfile.driver_flags(
        "580.95.05",
        dkms=False,
        kernel_module_type="proprietary",
        opengl_files=True,
        drm=False,
        x_check=True,
        extra=["--no-peermem"],
    )
    assert flags == ["--silent", "--kernel-module-type=proprietary", "--no-drm", "--no-peermem"]


def test_default_module_type_passes_no_flag() -> None:
    flags = runfile.driver_flags("580.95.05", kernel_module_type="default")
    assert not any("kernel-module" in f or f.startswith("-m=") for f in flags)


def test_open_modules_before_r515_refused() -> None:
    with pytest.raises(RunfileError, match="no open kernel modules"):
        runfile.driver_flags("470.256.02", kernel_module_type="open")


def test_toolkit_flags() -> None:
    assert runfile.toolkit_flags("/usr/local/cuda-12.8") == [
        "--silent",
        "--toolkit",
        "--toolkitpath=/usr/local/cuda-12.8",
        "--no-opengl-libs",
        "--no-man-page",
    ]
    flags = runfile.toolkit_flags("/opt/cuda", override=True, opengl_libs=True, man_pages=True, extra=["--tmpdir=/x"])
    assert flags == ["--silent", "--toolkit", "--toolkitpath=/opt/cuda", "--override", "--tmpdir=/x"]
    assert "--driver" not in flags


def test_toolkit_prefix_must_be_absolute() -> None:
    with pytest.raises(RunfileError, match="absolute path"):
        runfile.toolkit_flags("cuda-12.8")


def test_parse_driver_record_as_nvidia_installer_writes_it() -> None:
    record = "1.0-5809505 (580.95.05)\nNVIDIA Accelerated Graphics Driver for Linux-x86_64\n1: /usr/bin/nvidia-smi\n"
    assert runfile.parse_driver_record(record) == "580.95.05"
    assert runfile.parse_driver_record("1.0-9631\nold driver\n") is None
    assert runfile.parse_driver_record("") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.95.05  Release Build  "
            "(dvs-builder@U16-I1-N08-12-1)  Thu Sep 25 23:25:37 UTC 2025\nGCC version:  gcc version 13.3.0\n",
            "580.95.05",
        ),
        (
            "NVRM version: NVIDIA UNIX x86_64 Kernel Module  535.104.05  Sat Aug 19 01:15:15 UTC 2023\n",
            "535.104.05",
        ),
        (
            # Captured on the H200 device machine (a NixOS-built driver, so no nvidia-installer record there).
            "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build  (nixbld@)  \n"
            "GCC version:  gcc version 15.3.0 (GCC) \n",
            "580.159.04",
        ),
        ("GCC version: gcc 12\n", None),
    ],
)
def test_parse_proc_version(text: str, expected: str | None) -> None:
    assert runfile.parse_proc_version(text) == expected


def test_parse_toolkit_version_json() -> None:
    text = json.dumps({"cuda": {"name": "CUDA SDK", "version": "12.8.1"}, "cuda_cudart": {"version": "12.8.90"}})
    assert runfile.parse_toolkit_version_json(text) == "12.8.1"
    assert runfile.parse_toolkit_version_json("{not json") is None
    assert runfile.parse_toolkit_version_json('{"cuda_nvcc": {"version": "12.8.93"}}') is None


@pytest.mark.parametrize(
    ("kind", "name", "version"),
    [
        ("driver", "NVIDIA-Linux-x86_64-580.95.05.run", "580.95.05"),
        ("driver", "/x/NVIDIA-Linux-x86_64-550.144.03-no-compat32.run", "550.144.03"),
        ("toolkit", "cuda_13.0.2_580.95.05_linux.run", "13.0.2"),
        ("toolkit", "cuda_12.8.1_570.124.06_linux_sbsa.run", "12.8.1"),
        ("driver", "driver.run", None),
        ("toolkit", "NVIDIA-Linux-x86_64-580.95.05.run", None),
    ],
)
def test_runfile_version_from_name(kind: str, name: str, version: str | None) -> None:
    assert runfile.runfile_version_from_name(kind, name) == version


def test_runfile_name_for_another_version_is_refused() -> None:
    runfile.check_runfile_name("driver", "/c/NVIDIA-Linux-x86_64-580.95.05.run", "580.95.05")
    runfile.check_runfile_name("driver", "/c/renamed.run", "580.95.05")
    with pytest.raises(RunfileError, match="is driver 570.133.20 but version 580.95.05 was requested"):
        runfile.check_runfile_name("driver", "/c/NVIDIA-Linux-x86_64-570.133.20.run", "580.95.05")


def test_detection_reads_the_files_under_a_root(tmp_path: Path) -> None:
    assert runfile.installed_driver(str(tmp_path)) is None
    assert runfile.loaded_driver_from_kernel(str(tmp_path)) is None
    (tmp_path / "var/lib/nvidia").mkdir(parents=True)
    (tmp_path / "var/lib/nvidia/log").write_text("1.0-57013320 (570.133.20)\nNVIDIA driver\n")
    (tmp_path / "sys/module/nvidia").mkdir(parents=True)
    (tmp_path / "sys/module/nvidia/version").write_text("570.133.20\n")
    assert runfile.installed_driver(str(tmp_path)) == "570.133.20"
    assert runfile.loaded_driver_from_kernel(str(tmp_path)) == "570.133.20"
    prefix = tmp_path / "usr/local/cuda-12.8"
    assert runfile.installed_toolkit(str(prefix)) is None
    prefix.mkdir(parents=True)
    (prefix / "version.json").write_text('{"cuda": {"version": "12.8.1"}}')
    assert runfile.installed_toolkit(str(prefix)) == "12.8.1"


def test_tail_returns_the_last_lines(tmp_path: Path) -> None:
    log = tmp_path / "nvidia-installer.log"
    log.write_text("".join(f"line {i}\n" for i in range(100)))
    assert runfile.tail(str(log), 3) == "line 97\nline 98\nline 99"
    assert runfile.tail(str(tmp_path / "missing.log")) == ""


def test_packaged_driver_found_in_dpkg_output() -> None:
    output = "\n".join(
        [
            "nvidia-driver-580 installed",
            "libnvidia-compute-580 installed",
            "nvidia-dkms-580 installed",
            "nvidia-utils-580 installed",
            "nvidia-kernel-dkms installed",
            "libnvidia-ml1 installed",
            "cuda-drivers-580 installed",
            "nvidia-driver-575 config-files",
            "nvidia-container-toolkit installed",
            "nvidia-persistenced-doc not-installed",
        ]
    )
    assert runfile.packaged_driver(output) == [
        "cuda-drivers-580",
        "libnvidia-compute-580",
        "libnvidia-ml1",
        "nvidia-dkms-580",
        "nvidia-driver-580",
        "nvidia-kernel-dkms",
        "nvidia-utils-580",
    ]


def test_no_packaged_driver_on_a_runfile_node() -> None:
    assert runfile.packaged_driver("nvidia-container-toolkit installed\ndkms installed\n") == []
    assert runfile.packaged_driver("") == []


def test_unmanaged_install_of_the_requested_version_is_left_alone() -> None:
    assert runfile.settle_unmanaged("driver", "580.159.04", "580.159.04") == runfile.NOTHING
    # nvcc tells only the release: a toolkit of the requested release counts as there.
    assert runfile.settle_unmanaged("toolkit", "13.0", "13.0.2", "/usr/local/cuda-13.0") == runfile.NOTHING


def test_unmanaged_install_of_another_version_is_refused() -> None:
    with pytest.raises(RunfileError, match="driver 580.159.04 is installed but nvidia-installer has no record"):
        runfile.settle_unmanaged("driver", "580.159.04", "590.44.01")
    with pytest.raises(RunfileError, match="toolkit 12.8 is installed in /usr/local/cuda-12.8 but there is no"):
        runfile.settle_unmanaged("toolkit", "12.8", "12.9.1", "/usr/local/cuda-12.8")
