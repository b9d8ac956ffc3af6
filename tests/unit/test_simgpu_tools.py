"""The nvidia-smi stand-in and simgpuctl, run as programs against the simulated library."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpufleet import simgpu

CAPTURE = Path(__file__).resolve().parents[3] / "shared" / "data" / "h200-capture.json"
H200_UUID = "GPU-1757f6d0-d02c-d95a-c569-55d572b0340a"
REFERENCE = simgpu.SIMGPU_DIR / "reference" / "h200-580.159.04"  # recorded from a real nvidia-smi


def smi(
    machine: simgpu.SimulatedMachine, *arguments: str, library_dir: Path | None = None
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "LD_LIBRARY_PATH": str(library_dir or machine.library.parent)}
    return subprocess.run(
        [sys.executable, str(simgpu.NVIDIA_SMI), *arguments], capture_output=True, text=True, env=env, check=False
    )


def ctl(description: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(simgpu.SIMGPUCTL), "--description", str(description), *arguments],
        capture_output=True,
        text=True,
        check=False,
    )


def test_table_for_the_h200(simgpu_machine: simgpu.SimulatedMachine) -> None:
    result = smi(simgpu_machine)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    boxed = [line for line in lines[1:] if line]
    assert {len(line) for line in boxed} == {91}
    assert lines[2] == "| NVIDIA-SMI 580.159.04             Driver Version: 580.159.04     CUDA Version: 13.0     |"
    assert lines[8] == "|   0  NVIDIA H200                    On  |   00000000:00:06.0 Off |                    0 |"
    assert lines[9] == "| N/A   31C    P0            114W /  700W |       0MiB / 143771MiB |      0%      Default |"
    assert lines[10] == "|                                         |                        |             Disabled |"


@pytest.mark.skipif(not CAPTURE.is_file(), reason="the real H200 capture (../shared/data) is not present")
def test_table_header_equals_the_real_nvidia_smi(simgpu_machine: simgpu.SimulatedMachine) -> None:
    header = json.loads(CAPTURE.read_text())["nvidia_smi_header"]
    assert smi(simgpu_machine).stdout.splitlines()[2][2:-2].rstrip() == header


def test_table_shows_each_gpu_and_errors(simgpu_machine: simgpu.SimulatedMachine) -> None:
    simgpu_machine.ctl("gpu-count", "2")
    simgpu_machine.ctl("ecc-errors", "--gpu", "1", "4")
    simgpu_machine.ctl("persistence", "off", "--gpu", "1")
    lines = smi(simgpu_machine).stdout.splitlines()
    assert lines[12] == "|   1  NVIDIA H200                    Off |   00000000:00:07.0 Off |                    4 |"


def test_query_csv_with_header_and_units(simgpu_machine: simgpu.SimulatedMachine) -> None:
    result = smi(
        simgpu_machine, "--query-gpu=index,name,memory.total,power.limit,fan.speed,temperature.gpu", "--format=csv"
    )
    assert result.stdout.splitlines() == [
        "index, name, memory.total [MiB], power.limit [W], fan.speed [%], temperature.gpu",
        "0, NVIDIA H200, 143771 MiB, 700.00 W, [N/A], 31",
    ]


def test_memory_used_excludes_reserved_as_in_nvidia_smi(simgpu_machine: simgpu.SimulatedMachine) -> None:
    simgpu_machine.ctl("set", "gpus.0.memory_used_bytes", str(2048 * 1024 * 1024))
    result = smi(simgpu_machine, "--query-gpu=memory.used,memory.reserved,memory.free", "--format=csv,noheader")
    assert result.stdout == "2048 MiB, 616 MiB, 141108 MiB\n"


def test_same_output_as_the_real_nvidia_smi(simgpu_machine: simgpu.SimulatedMachine) -> None:
    """The stand-in, set to the live values of the recorded real H200, prints exactly what it printed."""
    simgpu_machine.ctl("set", "gpus.0.uuid", '"GPU-00000000-0000-0000-0000-000000000000"')
    simgpu_machine.ctl("set", "gpus.0.temperature_c", "37")
    simgpu_machine.ctl("set", "gpus.0.power_draw_w", "123.61")
    real_query = (REFERENCE / "nvidia-smi-query.csv").read_text().splitlines()
    fields = real_query[0].replace(" [MiB]", "").replace(" [W]", "").replace(" [%]", "").replace(" ", "")
    assert smi(simgpu_machine, f"--query-gpu={fields}", "--format=csv").stdout.splitlines() == real_query
    real_memory = (REFERENCE / "nvidia-smi-memory.csv").read_text()
    memory = smi(simgpu_machine, "--query-gpu=memory.used,memory.reserved,memory.free", "--format=csv")
    assert memory.stdout == real_memory
    assert smi(simgpu_machine, "--version").stdout == (REFERENCE / "nvidia-smi-version.txt").read_text()
    simgpu_machine.ctl("set", "gpus.0.temperature_c", "38")
    simgpu_machine.ctl("set", "gpus.0.power_draw_w", "126")
    real_table = (REFERENCE / "nvidia-smi.txt").read_text().splitlines()
    table = smi(simgpu_machine).stdout.splitlines()
    assert table[1:] == real_table[1:]  # all but the date
    assert len(table[0]) == len(real_table[0])


def test_query_csv_noheader_nounits(simgpu_machine: simgpu.SimulatedMachine) -> None:
    simgpu_machine.ctl("gpu-count", "3")
    result = smi(simgpu_machine, "--query-gpu=index,memory.total,ecc.mode.current", "--format=csv,noheader,nounits")
    assert result.stdout.splitlines() == ["0, 143771, Enabled", "1, 143771, Enabled", "2, 143771, Enabled"]


def test_list_and_select_by_uuid(simgpu_machine: simgpu.SimulatedMachine) -> None:
    assert smi(simgpu_machine, "-L").stdout == f"GPU 0: NVIDIA H200 (UUID: {H200_UUID})\n"
    simgpu_machine.ctl("gpu-count", "2")
    second = simgpu_machine.read()["gpus"][1]["uuid"]
    result = smi(simgpu_machine, "-i", second, "--query-gpu=index,uuid", "--format=csv,noheader")
    assert result.stdout == f"1, {second}\n"


def test_version(simgpu_machine: simgpu.SimulatedMachine) -> None:
    lines = smi(simgpu_machine, "--version").stdout.splitlines()
    # As the real nvidia-smi 580.159.04 prints it (NVML itself reports "13.580.159.04").
    assert lines == [
        "NVIDIA-SMI version  : 580.159.04",
        "NVML version        : 580.159",
        "DRIVER version      : 580.159.04",
        "CUDA Version        : 13.0",
    ]


@pytest.mark.parametrize(
    ("switch", "arguments", "code", "message"),
    [
        (("driver", "unload"), (), 9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver"),
        (("mismatch", "570.133.20"), (), 18, "Failed to initialize NVML: Driver/library version mismatch"),
        (("lose", "--gpu", "0"), (), 15, "Unable to determine the device handle for GPU 0: GPU is lost"),
        ((), ("--query-gpu=index,warp", "--format=csv"), 2, 'Field "warp" is not a valid field to query.'),
        ((), ("--query-gpu=index", "--format=xml"), 2, '"xml" is not a valid format'),
        ((), ("-i", "7", "-L"), 6, "No devices were found"),
    ],
)
def test_failures_use_nvidia_smi_exit_codes(
    simgpu_machine: simgpu.SimulatedMachine,
    switch: tuple[str, ...],
    arguments: tuple[str, ...],
    code: int,
    message: str,
) -> None:
    if switch:
        simgpu_machine.ctl(*switch)
    result = smi(simgpu_machine, *arguments)
    assert result.returncode == code
    assert result.stderr.startswith(message) and result.stdout == ""


def test_missing_library(simgpu_machine: simgpu.SimulatedMachine, tmp_path: Path) -> None:
    result = smi(simgpu_machine, library_dir=tmp_path)
    assert result.returncode == 12
    assert "NVIDIA-SMI couldn't find libnvidia-ml.so library in your system." in result.stderr


def test_ctl_reset_writes_the_default_description(tmp_path: Path) -> None:
    description = tmp_path / "nested" / "gpus.json"
    assert ctl(description, "reset").returncode == 0
    assert json.loads(description.read_text()) == json.loads(simgpu.DEFAULT_DESCRIPTION.read_text())
    shown = ctl(description, "show")
    assert json.loads(shown.stdout)["gpus"][0]["uuid"] == H200_UUID


def test_ctl_driver_version_keeps_library_and_module_together(tmp_path: Path) -> None:
    description = tmp_path / "gpus.json"
    ctl(description, "reset")
    ctl(description, "mismatch", "570.133.20")
    ctl(description, "driver-version", "575.51.03")
    driver = json.loads(description.read_text())["driver"]
    assert driver["version"] == driver["kernel_module_version"] == "575.51.03"
    assert driver["nvml_version"] == "13.575.51.03"


@pytest.mark.parametrize(
    ("arguments", "error"),
    [
        (("ecc-errors", "--gpu", "3", "1"), "--gpu 3: the description has GPUs 0..0"),
        (("gpu-count", "40"), "gpu-count 40: choose 0 to 32"),
        (("mismatch", "580.159.04"), "give a kernel module version different from the library's 580.159.04"),
        (("not-supported", "warp_drive"), "unknown feature 'warp_drive'"),
        (("set", "gpus.9.name", '"x"'), "gpus.9.name does not name a place in the description"),
        (("set", "gpus.0.name", "unquoted"), "is not a JSON value"),
    ],
)
def test_ctl_bad_input_is_one_line(tmp_path: Path, arguments: tuple[str, ...], error: str) -> None:
    description = tmp_path / "gpus.json"
    ctl(description, "reset")
    before = description.read_text()
    result = ctl(description, *arguments)
    assert result.returncode == 2
    assert result.stderr.startswith("simgpuctl: error: ") and error in result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
    assert description.read_text() == before


def test_ctl_on_a_missing_description_says_how_to_fix(tmp_path: Path) -> None:
    result = ctl(tmp_path / "absent.json", "persistence", "off")
    assert result.returncode == 2 and "run `simgpuctl reset`" in result.stderr
