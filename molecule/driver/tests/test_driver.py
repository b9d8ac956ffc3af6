"""State the nvidia_driver role leaves on every lab host (LAB-STANDIN driver 580.95.05), read from the host."""

DRIVER = "580.95.05"


def test_nvidia_installer_recorded_the_driver(host) -> None:
    record = host.file("/var/lib/nvidia/log")
    assert record.exists and record.mode == 0o600
    assert record.content_string.splitlines()[0] == f"1.0-{DRIVER.replace('.', '')} ({DRIVER})"


def test_nvml_reports_the_driver_and_persistence_mode(host) -> None:
    out = host.check_output("nvidia-smi --query-gpu=driver_version,persistence_mode --format=csv,noheader")
    assert out.strip() == f"{DRIVER}, Enabled"


def test_installer_ran_with_the_roles_flags(host) -> None:
    log = host.file("/var/log/nvidia-installer.log").content_string
    assert "    --silent\n    --dkms\n    --kernel-module-type=open\n    --no-opengl-files\n    --no-x-check\n" in log
    assert f"(version: {DRIVER}) is now complete" in log


def test_dkms_knows_the_module(host) -> None:
    assert f"nvidia/{DRIVER}" in host.check_output("dkms status -m nvidia")


def test_nouveau_blacklisted(host) -> None:
    conf = host.file("/etc/modprobe.d/blacklist-nouveau.conf")
    assert conf.mode == 0o644 and conf.contains("^blacklist nouveau$") and conf.contains("^options nouveau modeset=0$")


def test_persistenced_runs_and_starts_at_boot(host) -> None:
    service = host.service("nvidia-persistenced")
    assert service.is_running and service.is_enabled


def test_runfile_kept_in_the_node_cache(host) -> None:
    found = host.check_output(f"find /var/cache/gpufleet/artifacts -name NVIDIA-Linux-x86_64-{DRIVER}.run")
    digest, _ = host.check_output(f"sha256sum {found.strip()}").split()
    assert found.strip() == f"/var/cache/gpufleet/artifacts/{digest}/NVIDIA-Linux-x86_64-{DRIVER}.run"
