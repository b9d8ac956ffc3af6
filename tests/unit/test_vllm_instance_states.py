"""What an upgrade's snapshot keeps of each instance (filter gpufleet.fleet.vllm_instance_states): systemd's state
and, from its drop-in, its port, served name and whether it is a headless member (restore waits for no API there)."""

from __future__ import annotations

import base64
import importlib.util
from pathlib import Path

FILTER = Path(__file__).resolve().parents[2] / "plugins" / "filter" / "gpufleet_systemd.py"


def states(dropins: dict[str, str]) -> dict:
    spec = importlib.util.spec_from_file_location("gpufleet_systemd", FILTER)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    units = {f"vllm@{name}.service": {"ActiveState": "active", "UnitFileState": "enabled"} for name in dropins}
    results = [{"item": name, "content": base64.b64encode(text.encode()).decode()} for name, text in dropins.items()]
    return module.vllm_instance_states(sorted(dropins), units, results)


def test_a_headless_member_is_kept_as_one() -> None:
    leader = 'ExecStart="/v/bin/python" "-m" "vllm" "--port" "8002" "--served-model-name" "tiny-wide" "--nnodes" "2"'
    member = leader.replace('"-m" "vllm"', '"/usr/local/lib/gpufleet-vllm-headless-member.py"') + ' "--headless"'
    found = states({"wide": member, "main": leader.replace('"tiny-wide" "--nnodes" "2"', '"tiny"')})
    assert found["wide"] == {
        "active": True,
        "enabled": True,
        "port": 8002,
        "served_model_name": "tiny-wide",
        "headless": True,
    }
    assert found["main"]["headless"] is False and found["main"]["served_model_name"] == "tiny"
