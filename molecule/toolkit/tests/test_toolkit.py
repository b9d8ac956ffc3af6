"""State the cuda_toolkit role leaves on every lab host (12.8.1 and 13.0.2, 13.0 active), read from the host."""

import pytest


@pytest.mark.parametrize(
    ("prefix", "version"), [("/usr/local/cuda-12.8", "12.8.1"), ("/usr/local/cuda-13.0", "13.0.2")]
)
def test_toolkits_side_by_side(host, prefix: str, version: str) -> None:
    assert f'"version": "{version}"' in host.file(f"{prefix}/version.json").content_string
    assert f"V{version}" in host.check_output(f"{prefix}/bin/nvcc --version")


def test_link_points_at_the_active_toolkit(host) -> None:
    link = host.file("/usr/local/cuda")
    assert link.is_symlink and link.linked_to == "/usr/local/cuda-13.0"


def test_login_shell_finds_nvcc_and_cuda_home(host) -> None:
    out = host.check_output("bash -lc 'nvcc --version; echo CUDA_HOME=$CUDA_HOME'")
    assert "Cuda compilation tools, release 13.0," in out and "CUDA_HOME=/usr/local/cuda" in out
    assert host.file("/etc/profile.d/cuda.sh").mode == 0o644


def test_loader_finds_the_active_runtime(host) -> None:
    assert host.file("/etc/ld.so.conf.d/cuda.conf").contains("^/usr/local/cuda/lib64$")
    assert "libcudart.so.13 (libc6,x86-64) => /usr/local/cuda/lib64/libcudart.so.13" in host.check_output("ldconfig -p")
