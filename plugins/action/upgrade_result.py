# -*- coding: utf-8 -*-
"""Action plugin upgrade_result: record one node's outcome of a rolling upgrade without contacting the host.

The result carries the outcome under the key `gpufleet_upgrade` (what `gpufleet upgrade` reads from the runner's
events, as it reads `gpufleet_drift` from a drift run) and as the fact upgrade_outcome (ansible_facts.upgrade_outcome: what the
playbook's own report and failure budget read). Documentation: plugins/modules/upgrade_result.py.
"""

from __future__ import annotations

import re
import time

from ansible.plugins.action import ActionBase

STATUSES = ("upgraded", "unchanged", "skipped", "not_upgraded", "rolled_back", "failed")

ARGUMENT_SPEC = {
    "status": {"type": "str", "required": True, "choices": list(STATUSES)},
    "layers": {"type": "list", "elements": "str", "default": []},
    "reason": {"type": "str", "default": ""},
    "state": {"type": "str", "required": True},
    "began": {"type": "float"},
    "restored": {"type": "list", "elements": "str", "default": []},
    "not_restored": {"type": "list", "elements": "str", "default": []},
}


def one_line(text: str, limit: int = 600) -> str:
    """Whitespace folded, control characters out (node text reaches the operator's terminal), at most limit."""
    folded = re.sub(r"[\x00-\x1f\x7f]+", " ", str(text or ""))
    folded = re.sub(r"\s+", " ", folded).strip()
    return folded if len(folded) <= limit else folded[: limit - 3] + "..."


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        began = args.get("began")
        outcome = {
            "node": str(task_vars.get("inventory_hostname", "")),
            "status": args["status"],
            "layers": [str(layer) for layer in args["layers"]],
            "reason": one_line(args["reason"]),
            "state": one_line(args["state"]),
            "restored": [one_line(item, 200) for item in args["restored"]],
            "not_restored": [one_line(item, 300) for item in args["not_restored"]],
            "seconds": round(time.time() - float(began), 1) if began else 0,
        }
        result["changed"] = False
        result["gpufleet_upgrade"] = outcome
        result["ansible_facts"] = {"upgrade_outcome": outcome}
        result["msg"] = "%s: %s" % (outcome["node"], outcome["status"])
        return result
