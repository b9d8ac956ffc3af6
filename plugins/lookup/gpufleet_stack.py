# -*- coding: utf-8 -*-
"""Lookup plugin gpufleet_stack: what the host's declared stack installs, validated first.

Every role derives its versions and artifacts from gpufleet_stack through this lookup, so a value can only
come from a stack the knowledge base found compatible: whatever tags or limits a run has, the stack of every
host a role runs on is validated before the role can read anything from it.
"""

from __future__ import annotations

DOCUMENTATION = r"""
name: gpufleet_stack
short_description: Versions and artifacts that the host's gpufleet_stack installs, after validating it
description:
  - Validates the host's C(gpufleet_stack) against the knowledge base (data/compat), then returns the value at
    each dotted path of what the stack resolves to, for example C(driver.version), C(driver.runfile),
    C(driver.fabric_manager) (the fabric manager archive of the driver, or of O(version), resolved only when asked),
    C(toolkits), C(toolkit.version), C(python.version), C(python.tarball), C(pyenv), C(venv), C(kernels),
    C(stack).
  - Reads C(gpufleet_mirror_url), C(gpufleet_artifact_sha256) (file name to sha256, for files the knowledge
    base has no checksum for), C(cuda_toolkit_extra_versions), C(inference_venv_stack_options) and
    C(pyenv_python_pyenv_version) from the host's variables.
  - Fails with every broken link named when the stack is not compatible, and with the missing fact and the fix
    when an artifact cannot be resolved.
options:
  _terms:
    description: Dotted paths into the resolved stack.
    required: true
  version:
    description: With C(driver.runfile) or C(driver.fabric_manager), the file of this driver release instead of the stack's.
    type: str
"""

EXAMPLES = r"""
nvidia_driver_version: "{{ lookup('gpufleet.fleet.gpufleet_stack', 'driver.version') }}"
cuda_toolkit_versions: "{{ lookup('gpufleet.fleet.gpufleet_stack', 'toolkits') }}"
"""

RETURN = r"""
_raw:
  description: The value at each path.
  type: list
"""

import os

from ansible.errors import AnsibleLookupError
from ansible.plugins.lookup import LookupBase
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.stack_resolve import inputs_of, validate_and_resolve


def path_value(resolved: dict, path: str):
    value = resolved
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise AnsibleLookupError("gpufleet_stack has no %r (known: %s)" % (path, ", ".join(sorted(resolved))))
        value = value[part]
    return value


# The host variables the stack is resolved from.
STACK_VARIABLES = (
    "gpufleet_stack",
    "gpufleet_mirror_url",
    "gpufleet_artifact_sha256",
    "cuda_toolkit_extra_versions",
    "inference_venv_stack_options",
    "pyenv_python_pyenv_version",
)
# Templated inputs per (process, host). Ansible runs each task of each host in a worker forked for it, so within
# one process a host's variables do not change: the role defaults one task templates read the stack several
# times, and templating these variables (the lab's pins read a file) was most of each call's cost.
_INPUTS: dict = {}


def artifacts():
    """The resolver's artifact module, imported only by the answers that compute an artifact (a fabric manager
    archive, another driver version); the others come from stack_resolve's cache without it."""
    from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_artifacts

    return stack_artifacts


class LookupModule(LookupBase):
    def _inputs(self, variables) -> dict:
        key = (os.getpid(), str(variables.get("inventory_hostname", "")))
        if key not in _INPUTS:
            _INPUTS[key] = inputs_of(
                {name: self._templar.template(variables[name]) for name in STACK_VARIABLES if name in variables}
            )
        return _INPUTS[key]

    def run(self, terms, variables=None, **kwargs):
        inputs = self._inputs(variables or {})
        outcome = validate_and_resolve(inputs)
        if outcome["error"]:
            raise AnsibleLookupError(outcome["error"])
        version = kwargs.get("version")
        if list(terms) == ["driver.fabric_manager"] and outcome["resolved"]["driver"]:
            # Not part of every stack's artifacts: only an NVSwitch system's role asks for it.
            try:
                return [
                    artifacts().fabric_manager_archive(
                        str(version or outcome["resolved"]["driver"]["version"]), inputs["mirror_url"], inputs["pins"]
                    )
                ]
            except artifacts().ArtifactError as error:
                raise AnsibleLookupError(str(error))
        if version and outcome["resolved"]["driver"] and str(version) != outcome["resolved"]["driver"]["version"]:
            # nvidia_driver_version set on purpose to another driver: that driver's runfile.
            try:
                return [artifacts().driver_runfile(str(version), inputs["mirror_url"], inputs["pins"])]
            except artifacts().ArtifactError as error:
                raise AnsibleLookupError(str(error))
        return [path_value(outcome["resolved"], str(term)) for term in terms]
