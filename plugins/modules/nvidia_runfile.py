#!/usr/bin/python
# -*- coding: utf-8 -*-
"""Install an NVIDIA driver or CUDA toolkit from NVIDIA's .run installer, idempotently."""

from __future__ import annotations

DOCUMENTATION = r"""
---
module: nvidia_runfile
short_description: Install an NVIDIA driver or CUDA toolkit from its .run installer, idempotently
description:
  - Detects what is installed and does nothing when the requested version is already there.
  - "Driver: the installed version is the one C(nvidia-installer) recorded in C(/var/lib/nvidia/log); the
    loaded kernel module is read through NVML (C(libnvidia-ml.so.1)) when the library is present, else from
    C(/proc/driver/nvidia/version) or C(/sys/module/nvidia/version)."
  - "Toolkit: the installed version is C(version.json) under the toolkit prefix (several toolkits live side by
    side, one prefix each)."
  - Otherwise runs the runfile with C(sh RUNFILE FLAGS) and the flags built from the options below, plus
    O(extra_flags). On failure returns the tail of the installer's log (C(/var/log/nvidia-installer.log) or
    C(/var/log/cuda-installer.log)).
  - "An upgrade or allowed downgrade of the driver first removes the previous one the way NVIDIA does it:
    the installer of the installed version, kept as C(/usr/bin/nvidia-uninstall), runs with C(--silent).
    nvidia-installer would also call it by itself (backup.c C(run_existing_uninstaller)); running it
    first makes a failure of the removal visible on its own. A toolkit replaced in the same prefix is
    removed with that prefix's C(bin/cuda-uninstaller --silent)."
  - A downgrade is refused unless O(allow_downgrade) is set.
  - "An install made another way is not replaced: a loaded driver whose libraries work but that
    nvidia-installer did not record (a host image, a container runtime), or a prefix with a working nvcc but no
    version.json. When it already is the requested version (the driver's version, the toolkit's release) the
    module does nothing and returns RV(unmanaged)=true; otherwise it fails and says so."
  - "A driver installed from packages (Debian C(nvidia-driver), Ubuntu C(nvidia-driver-580), NVIDIA's
    C(cuda-drivers), ...; read with C(dpkg-query)) is refused: a runfile install over it breaks both. Remove the
    packages and reboot first."
  - "Driver flags (nvidia-installer C(--advanced-options)): C(--silent) (implies C(--ui=none --no-questions)),
    C(--dkms), C(--kernel-module-type=open|proprietary) from the R560 installer on, C(-m=kernel-open|kernel)
    (C(--kernel-module-build-directory)) on R515 to R555, C(--no-opengl-files), C(--no-drm), C(--no-x-check)."
  - "Toolkit flags (CUDA installation guide, runfile advanced options): C(--silent --toolkit
    --toolkitpath=PREFIX), C(--override), C(--no-opengl-libs), C(--no-man-page). C(--driver) is never passed:
    the driver is managed by its own runfile."
version_added: "0.1.0"
author:
  - gpufleet engineers (!UNKNOWN)
options:
  kind:
    description: What the runfile installs.
    type: str
    required: true
    choices: [driver, toolkit]
  version:
    description:
      - The version the runfile installs, e.g. C(580.95.05) for a driver, C(12.8.1) for a toolkit.
      - When the runfile carries NVIDIA's file name, the version in the name must match.
    type: str
    required: true
  runfile:
    description:
      - Path of the runfile on the target, verified beforehand (see the artifact role).
      - Needed only when something must be installed; check mode never reads it.
    type: path
    required: true
  sha256:
    description:
      - Expected sha256 of the runfile. When set, the file is hashed right before it runs and refused on a
        mismatch, with both hashes in the message; nothing is run then.
    type: str
  prefix:
    description: Toolkit prefix. Defaults to C(/usr/local/cuda-MAJOR.MINOR) of O(version).
    type: path
  dkms:
    description: Driver only. Register the kernel module with DKMS so it is rebuilt for new kernels (C(--dkms)).
    type: bool
    default: true
  kernel_module_type:
    description:
      - Driver only. C(open) modules are required for Blackwell and recommended from Turing on;
        C(proprietary) for older GPUs; C(default) passes nothing and leaves the choice to the installer.
    type: str
    choices: [open, proprietary, default]
    default: open
  opengl_files:
    description: Driver only. Install the OpenGL files; headless servers do not need them (C(--no-opengl-files)).
    type: bool
    default: false
  drm:
    description: Driver only. Install the nvidia-drm module; C(false) passes C(--no-drm).
    type: bool
    default: true
  x_check:
    description: Driver only. Let the installer check for a running X server; C(false) passes C(--no-x-check).
    type: bool
    default: false
  override:
    description: Toolkit only. Skip the installer's compiler version check (C(--override)).
    type: bool
    default: false
  opengl_libs:
    description: Toolkit only. Install the OpenGL libraries; C(false) passes C(--no-opengl-libs).
    type: bool
    default: false
  man_pages:
    description: Toolkit only. Install man pages; C(false) passes C(--no-man-page).
    type: bool
    default: false
  extra_flags:
    description: Further installer flags, appended verbatim after the ones built from the options.
    type: list
    elements: str
    default: []
  allow_downgrade:
    description: Replace an installed newer version with the requested older one.
    type: bool
    default: false
  uninstall_previous:
    description: On upgrade or downgrade, remove the installed version with its own uninstaller first.
    type: bool
    default: true
  log_lines:
    description: How many lines of the installer log to return on failure.
    type: int
    default: 40
extends_documentation_fragment:
  - gpufleet.fleet.attributes
attributes:
  check_mode:
    support: full
    details: Reports the action and the diff from the detected versions; never reads or runs the runfile.
  diff_mode:
    support: full
    details: Before and after are the installed and requested versions.
notes:
  - "Sources: nvidia-installer C(--advanced-options) help text and source (option_table.h, backup.c);
    NVIDIA Driver README chapters \"Installing the NVIDIA Driver\" and \"NVIDIA Open GPU Kernel Modules\";
    NVIDIA CUDA Installation Guide for Linux, runfile section."
  - The module does not reboot. For a driver it returns RV(reboot_required); the nvidia_driver role decides.
requirements:
  - root on the target
"""

EXAMPLES = r"""
- name: Install driver 580.95.05 with open kernel modules and DKMS
  gpufleet.fleet.nvidia_runfile:
    kind: driver
    version: "580.95.05"
    runfile: /var/cache/gpufleet/artifacts/NVIDIA-Linux-x86_64-580.95.05.run
    dkms: true
    kernel_module_type: open
  register: driver_install

- name: Install CUDA 12.8.1 beside other toolkits
  gpufleet.fleet.nvidia_runfile:
    kind: toolkit
    version: "12.8.1"
    runfile: /var/cache/gpufleet/artifacts/cuda_12.8.1_570.124.06_linux.run
    prefix: /usr/local/cuda-12.8
"""

RETURN = r"""
action:
  description: What was done (or, in check mode, what would be done).
  returned: always
  type: str
  sample: upgrade
  choices: [none, install, upgrade, downgrade]
installed_before:
  description: The version found before the run; null when none.
  returned: always
  type: str
  sample: "570.133.20"
installed:
  description: The version installed after the run (in check mode, the version that would be).
  returned: always
  type: str
  sample: "580.95.05"
requested:
  description: The requested version.
  returned: always
  type: str
  sample: "580.95.05"
prefix:
  description: Toolkit prefix.
  returned: when kind is toolkit
  type: str
  sample: /usr/local/cuda-12.8
loaded:
  description: Version of the driver kernel module the running kernel has loaded; null when none is or it is unknown.
  returned: when kind is driver
  type: str
  sample: "570.133.20"
driver_state:
  description:
    - State of the driver kernel module as NVML (or, without NVML, /proc) reports it.
    - C(mismatch) is NVML's "Driver/library version mismatch", the libraries on disk and the loaded module differ.
  returned: when kind is driver
  type: str
  choices: [loaded, not_loaded, mismatch, no_library]
  sample: mismatch
reboot_required:
  description:
    - The driver on disk is not the loaded one (a reboot loads it), or no driver module is loaded.
    - In check mode, about the host as it is now, not as the install would leave it.
  returned: when kind is driver
  type: bool
  sample: true
unmanaged:
  description: The requested version is there but was installed another way than by a runfile; nothing was done.
  returned: always
  type: bool
  sample: false
commands:
  description: The commands that were run (or would be run, in check mode), each as an argument list.
  returned: always
  type: list
  elements: list
  sample: [["/usr/bin/nvidia-uninstall", "--silent"], ["/bin/sh", "/var/cache/x.run", "--silent", "--dkms"]]
log_tail:
  description: Last lines of the installer log when an installer failed.
  returned: on failure
  type: str
"""

import os

from ansible.module_utils.basic import AnsibleModule
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvidia_versions import nvcc_release
from ansible_collections.gpufleet.fleet.plugins.module_utils.nvml import loaded_driver_state
from ansible_collections.gpufleet.fleet.plugins.module_utils.runfile import (
    DOWNGRADE,
    DRIVER_LOG,
    DRIVER_UNINSTALLER,
    NOTHING,
    TOOLKIT_LOG,
    UPGRADE,
    DPKG_QUERY_ARGS,
    RunfileError,
    check_runfile_name,
    decide,
    driver_flags,
    installed_driver,
    installed_toolkit,
    loaded_driver_from_kernel,
    packaged_driver,
    settle_unmanaged,
    tail,
    toolkit_flags,
    toolkit_release,
)

LOCALE_ENV = {"LANGUAGE": "C", "LC_ALL": "C"}


def build_flags(params: dict, prefix: str | None) -> list[str]:
    """The installer arguments for the module's parameters."""
    if params["kind"] == "driver":
        return driver_flags(
            params["version"],
            dkms=params["dkms"],
            kernel_module_type=params["kernel_module_type"],
            opengl_files=params["opengl_files"],
            drm=params["drm"],
            x_check=params["x_check"],
            extra=params["extra_flags"],
        )
    if prefix is None:
        raise RuntimeError("main() gives every toolkit run a prefix")
    return toolkit_flags(
        prefix,
        override=params["override"],
        opengl_libs=params["opengl_libs"],
        man_pages=params["man_pages"],
        extra=params["extra_flags"],
    )


def removal_command(kind: str, prefix: str | None) -> list[str] | None:
    """The uninstaller of the installed version, when it left one behind."""
    path = DRIVER_UNINSTALLER if kind == "driver" else os.path.join(prefix or "", "bin", "cuda-uninstaller")
    return [path, "--silent"] if os.path.exists(path) else None


def driver_packages(module: AnsibleModule) -> list[str]:
    """Installed packages that carry an NVIDIA driver; empty where dpkg is not the package manager."""
    dpkg_query = module.get_bin_path("dpkg-query")
    if not dpkg_query:
        return []
    # dpkg-query exits 1 when a pattern matches nothing; its output is still what it knows.
    rc, out, err = module.run_command([dpkg_query] + DPKG_QUERY_ARGS, environ_update=LOCALE_ENV)
    return packaged_driver(out)


def unmanaged_install(module: AnsibleModule, kind: str, prefix: str | None) -> str | None:
    """The version of a working install that no runfile recorded (a driver or toolkit installed another way).

    Driver: a loaded module whose libraries answer (NVML initialises) with no nvidia-installer record. A
    module left loaded after its own runfile's uninstall has no working libraries: that is not this case.
    Toolkit: a prefix whose bin/nvcc answers but that has no version.json; the release (X.Y) is returned.
    """
    if kind == "driver":
        state, version = loaded_driver_state(loaded_driver_from_kernel())
        return version if state == "loaded" and version else None
    if prefix is None:
        raise RuntimeError("main() gives every toolkit run a prefix")
    nvcc = os.path.join(prefix, "bin", "nvcc")
    if not os.path.exists(nvcc):
        return None
    rc, out, err = module.run_command([nvcc, "--version"], environ_update=LOCALE_ENV)
    return nvcc_release(out) if rc == 0 else None


def detect(kind: str, prefix: str | None) -> str | None:
    """The installed version of this kind (under prefix for a toolkit)."""
    if kind == "driver":
        return installed_driver()
    if prefix is None:
        raise RuntimeError("main() gives every toolkit run a prefix")
    return installed_toolkit(prefix)


def run_step(module: AnsibleModule, argv: list[str], log: str, what: str, result: dict) -> None:
    """Run one installer step; on failure exit with the log's tail."""
    rc, out, err = module.run_command(argv, environ_update=LOCALE_ENV)
    if rc != 0:
        log_tail = tail(log, module.params["log_lines"])
        module.fail_json(
            msg=f"{what} failed (exit {rc}); last lines of {log}:\n{log_tail or '(log is empty or missing)'}",
            rc=rc,
            stdout=out,
            stderr=err,
            log_tail=log_tail,
            **result,
        )


def verify_sha256(module: AnsibleModule, path: str, expected: str, result: dict) -> None:
    """Refuse a runfile whose content is not the pinned one, naming both hashes."""
    actual = module.sha256(path)
    if actual != expected.strip().lower():
        module.fail_json(
            msg=f"refusing {path}: sha256 is {actual}, expected {expected}; nothing was changed on the host",
            expected_sha256=expected,
            actual_sha256=actual,
            **result,
        )


def main() -> None:
    module = AnsibleModule(
        argument_spec=dict(
            kind=dict(type="str", required=True, choices=["driver", "toolkit"]),
            version=dict(type="str", required=True),
            runfile=dict(type="path", required=True),
            sha256=dict(type="str"),
            prefix=dict(type="path"),
            dkms=dict(type="bool", default=True),
            kernel_module_type=dict(type="str", default="open", choices=["open", "proprietary", "default"]),
            opengl_files=dict(type="bool", default=False),
            drm=dict(type="bool", default=True),
            x_check=dict(type="bool", default=False),
            override=dict(type="bool", default=False),
            opengl_libs=dict(type="bool", default=False),
            man_pages=dict(type="bool", default=False),
            extra_flags=dict(type="list", elements="str", default=[]),
            allow_downgrade=dict(type="bool", default=False),
            uninstall_previous=dict(type="bool", default=True),
            log_lines=dict(type="int", default=40),
        ),
        supports_check_mode=True,
    )
    params = module.params
    kind, requested, runfile = params["kind"], params["version"], params["runfile"]
    try:
        prefix = (params["prefix"] or f"/usr/local/cuda-{toolkit_release(requested)}") if kind == "toolkit" else None
        check_runfile_name(kind, runfile, requested)
        flags = build_flags(params, prefix)
        before = detect(kind, prefix)
        unmanaged = unmanaged_install(module, kind, prefix) if before is None else None
        if unmanaged is None:
            action = decide(before, requested, params["allow_downgrade"])
        else:
            action = settle_unmanaged(kind, unmanaged, requested, prefix)
    except RunfileError as error:
        module.fail_json(msg=str(error))
    packages = driver_packages(module) if kind == "driver" else []
    if packages:
        module.fail_json(
            msg=f"the NVIDIA driver is installed from packages ({', '.join(packages)}); a runfile install over it "
            "breaks both. Remove them (apt-get purge them) and reboot, then run again",
            driver_packages=packages,
        )

    log = DRIVER_LOG if kind == "driver" else TOOLKIT_LOG
    commands: list[list[str]] = []
    if action in (UPGRADE, DOWNGRADE) and params["uninstall_previous"]:
        removal = removal_command(kind, prefix)
        if removal:
            commands.append(removal)
    if action != NOTHING:
        commands.append(["/bin/sh", runfile] + flags)

    label = f"{kind} {prefix}" if kind == "toolkit" else kind
    result = dict(
        changed=action != NOTHING,
        action=action,
        installed_before=before,
        installed=requested if action != NOTHING else (before or unmanaged),
        requested=requested,
        unmanaged=unmanaged is not None,
        commands=commands,
        diff=dict(
            before=f"{label}: {before or unmanaged or 'absent'}\n",
            after=f"{label}: {requested if action != NOTHING else before or unmanaged}\n",
        ),
    )
    if prefix:
        result["prefix"] = prefix

    if action != NOTHING and not module.check_mode:
        if not os.path.isfile(runfile):
            module.fail_json(msg=f"runfile {runfile} does not exist on the host; fetch and verify it first", **result)
        if params["sha256"]:
            verify_sha256(module, runfile, params["sha256"], result)
        for argv in commands:
            what = "removal of the installed version" if argv[0] != "/bin/sh" else f"{os.path.basename(runfile)}"
            run_step(module, argv, log, what, result)
        result["installed"] = detect(kind, prefix)
        if result["installed"] != requested:
            module.fail_json(
                msg=f"the installer exited 0 but {label} is now {result['installed'] or 'absent'}, not {requested}; "
                f"last lines of {log}:\n{tail(log, params['log_lines'])}",
                **result,
            )

    if kind == "driver":
        # In check mode nothing was installed: the pending reboot is the one the host has now.
        on_disk = before if module.check_mode else result["installed"]
        result["driver_state"], result["loaded"] = loaded_driver_state(loaded_driver_from_kernel())
        result["reboot_required"] = on_disk is not None and (
            result["driver_state"] != "loaded" or result["loaded"] != on_disk
        )
    module.exit_json(**result)


if __name__ == "__main__":
    main()
