# -*- coding: utf-8 -*-
"""Action plugin drift_result: record a layer's outcome in a drift run without contacting the host.

Layers that are not declared, and layers whose checks could not run (the rescue of a layer), report here;
the first task of a drift run records the planned layers so that the report can name every layer of every
node, reached or not. Documentation: plugins/modules/drift_result.py.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase

STATUSES = ("not_declared", "error", "cordoned")

ARGUMENT_SPEC = {
    "layer": {"type": "str"},
    "status": {"type": "str", "choices": list(STATUSES)},
    "message": {"type": "str", "default": ""},
    "plan": {"type": "list", "elements": "str"},
}


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        result = super(ActionModule, self).run(tmp, task_vars or {})
        dummy, args = self.validate_argument_spec(
            argument_spec=ARGUMENT_SPEC,
            mutually_exclusive=[("plan", "layer")],
            required_one_of=[("plan", "layer")],
            required_together=[("layer", "status")],
        )
        result["changed"] = False
        if args.get("plan") is not None:
            result["gpufleet_drift_plan"] = [str(layer) for layer in args["plan"]]
            result["msg"] = "layers: %s" % ", ".join(result["gpufleet_drift_plan"])
            return result
        message = str(args["message"] or "").strip()
        result["gpufleet_drift"] = {
            "layer": str(args["layer"]),
            "status": args["status"],
            "drift": [],
            "errors": [{"check": "layer", "message": message}] if args["status"] == "error" else [],
            "checked": 0,
            "notes": [],
            "message": message,
        }
        result["msg"] = "%s: %s%s" % (args["layer"], args["status"], (" (%s)" % message) if message else "")
        result["ansible_facts"] = {"gpufleet_drift_last": result["gpufleet_drift"]}
        return result
