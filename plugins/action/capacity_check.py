# -*- coding: utf-8 -*-
"""Action plugin capacity_check: will each vLLM instance of this host fit its GPUs? Controller only, before any
host changes (issue 34). It runs plugins/plugin_utils/instance_capacity.py on the host's declared instances,
the small files of each model's repository (model_store_models[].shape) and the memory of the stack's GPUs
(data/compat/gpu_memory.csv). It never contacts the host, never changes anything and works the same in check
mode. Documentation: plugins/modules/capacity_check.py.
"""

from __future__ import annotations

from ansible.plugins.action import ActionBase
from ansible_collections.gpufleet.fleet.plugins.module_utils import stack_spec
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import gpu_memory, instance_capacity, stack_kb
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.stack_resolve import kb_dir, plain

ARGUMENT_SPEC = {
    "instances": {"type": "list", "elements": "dict", "required": True},
    "instance_defaults": {"type": "dict", "default": {}},
    "models": {"type": "list", "elements": "dict", "default": []},
    "stack": {"type": "dict"},
    "kb_dir": {"type": "path"},
    "logged": {"type": "dict"},
    "tolerance": {"type": "float", "default": 0.05},
}


def stack_gpus(stack, directory):
    """The memory of each GPU the stack declares, or ([], why one has none)."""
    try:
        normalized = stack_spec.normalize_stack(stack)
        if not normalized["gpu"]:
            return [], ""
        kb = stack_kb.load_kb(directory)
        rows = gpu_memory.read_rows(directory)
    except (stack_spec.StackError, stack_kb.KnowledgeBaseError, gpu_memory.GpuMemoryError) as error:
        return [], str(error)
    index = KbIndex(kb)
    memories = []
    for entry in normalized["gpu"]:
        resolved = index.resolve_gpu(entry)
        if resolved is None or resolved["row"] is None:
            return [], (
                "GPU %r is declared by compute capability or unknown: the planner needs a GPU model with a memory "
                "figure in data/compat/gpu_memory.csv (or capacity_check: false)" % entry
            )
        try:
            memories.append(gpu_memory.memory_of(rows, resolved["row"]["match"], entry))
        except gpu_memory.GpuMemoryError as error:
            return [], str(error)
    return memories, ""


class ActionModule(ActionBase):
    TRANSFERS_FILES = False
    _requires_connection = False
    _supports_check_mode = True

    def run(self, tmp=None, task_vars=None):
        task_vars = task_vars or {}
        result = super(ActionModule, self).run(tmp, task_vars)
        dummy, args = self.validate_argument_spec(argument_spec=ARGUMENT_SPEC)
        result["changed"] = False
        stack = args.get("stack")
        if stack is None:
            stack = self._templar.template(task_vars.get("gpufleet_stack"))
        stack = plain(stack)
        if not isinstance(stack, dict):
            result.update(failed=True, msg="no gpufleet_stack is declared for this host")
            return result
        gpus, gpu_problem = stack_gpus(stack, args.get("kb_dir") or kb_dir())
        checks = instance_capacity.check_instances(
            plain(args["instances"]),
            plain(args["instance_defaults"]),
            plain(args["models"]),
            gpus,
            str(stack.get("vllm") or ""),
            gpu_problem,
        )
        result["capacity"] = [check.as_dict() for check in checks]
        if args.get("logged") is not None:
            # After a start: compare with what vLLM logged, and warn; the verdicts were preflight's to enforce.
            logged = plain(args["logged"])
            compared = [
                instance_capacity.compare_with_log(check, logged[check.instance], args["tolerance"])
                for check in checks
                if check.instance in logged
            ]
            result["compared"] = compared
            result["warnings"] = [item["warning"] for item in compared if item["warning"]]
            return result
        result["gpus"] = [
            {
                "gpu": "%s %s" % (gpu.match, gpu.variant),
                "cuda_total_bytes": gpu.cuda_total_bytes,
                "assumed": gpu.assumed,
                "status": gpu.status,
                "source": gpu.source,
            }
            for gpu in gpus
        ]
        failing = [check for check in checks if check.status in ("does_not_fit", "refused")]
        if failing:
            result.update(
                failed=True,
                msg=" | ".join(
                    "%s: instance %s: %s" % (task_vars.get("inventory_hostname"), check.instance, check.message)
                    for check in failing
                ),
            )
        else:
            result["msg"] = "%d instance(s): %s" % (
                len(checks),
                "; ".join("%s %s" % (check.instance, check.status) for check in checks) or "none declared",
            )
        return result
