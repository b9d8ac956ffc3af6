"""The lab's load balancer configuration (gpufleet/lab/balancer.py), checked by HAProxy itself: every host a
server with a /health check, a request that got 503 or no answer retried on another node."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from gpufleet.lab.balancer import BALANCER_PORT, Backend, render


def test_every_host_is_a_checked_server_and_refusals_are_retried(tmp_path: Path) -> None:
    text = render("10.213.7.5", [Backend("lab-1", "10.213.7.6"), Backend("lab-2", "10.213.7.10")])
    assert f"bind 10.213.7.5:{BALANCER_PORT}" in text
    assert "server lab-1 10.213.7.6:443 check ssl" in text and "server lab-2 10.213.7.10:443 check ssl" in text
    assert "option httpchk GET /health" in text and "http-check expect status 200" in text
    assert "retry-on conn-failure empty-response response-timeout 503" in text
    assert "option http-buffer-request" in text  # a POST can be retried only when buffered
    if shutil.which("haproxy") is None:
        pytest.fail("haproxy is not installed: scripts/install-deps.sh installs it")
    path = tmp_path / "haproxy.cfg"
    # Loopback, so that the check needs no lab address on this machine.
    path.write_text(text.replace("10.213.7.5:", "127.0.0.1:"))
    checked = subprocess.run(["haproxy", "-c", "-f", str(path)], capture_output=True, text=True, check=False)
    assert checked.returncode == 0, checked.stdout + checked.stderr
