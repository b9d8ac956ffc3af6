# -*- coding: utf-8 -*-
"""What a declared stack installs: every version and artifact the layers need, derived from gpufleet_stack.

The stack (one per GPU class) is the only place an inventory writes a version. This module turns a validated
stack into what each role installs: the driver and toolkit runfiles (file name, URL on the mirror, sha256 and
where that sha256 came from), the exact CPython release with its tarball, the venv's requirements and the
kernel packages. The knowledge base supplies what it knows (NVIDIA's toolkit runfiles with their sha256,
CPython's tarballs from pyenv's definitions); what it cannot know (a driver runfile's sha256) the inventory
supplies once, in gpufleet_artifact_sha256 (file name -> sha256). The mirror layout lives here and nowhere
else.

Standard library only: the lookup plugin `gpufleet_stack`, the stack_validate action and the CLI share it.
"""

from __future__ import annotations

import re

MIRROR_DIRS = {
    "runfile": "nvidia",
    "python": "python",
    "pyenv": "pyenv",
    "sdist": "sdists",
    "wheels": "wheels",
}
TORCH_INDEX_URL = "https://download.pytorch.org/whl/%s"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
_MIRROR_RE = re.compile(r"^(https?|file)://\S+$")


class ArtifactError(ValueError):
    """A stack cannot be turned into artifacts; the message names the missing fact and the fix."""


def driver_runfile_name(version: str, arch: str = "x86_64") -> str:
    """NVIDIA's file name for a driver release: NVIDIA-Linux-x86_64-580.95.05.run."""
    return "NVIDIA-Linux-%s-%s.run" % (arch, version)


def model_dir_name(model: dict) -> str:
    """The directory a model is staged in under the model root: its name."""
    return str(model["name"])


def check_mirror_url(mirror_url) -> str:
    if not mirror_url or not isinstance(mirror_url, str):
        raise ArtifactError("gpufleet_mirror_url is not set: declare the artifact mirror once in the inventory "
                            "(group_vars/all), e.g. gpufleet_mirror_url: https://mirror.example.internal/gpufleet")
    if not _MIRROR_RE.match(mirror_url):
        raise ArtifactError("gpufleet_mirror_url %r is not an http(s):// or file:// URL" % (mirror_url,))
    return mirror_url.rstrip("/")


def mirror_url_of(mirror_url: str, kind: str, name: str) -> str:
    return "%s/%s/%s" % (check_mirror_url(mirror_url), MIRROR_DIRS[kind], name)


def pinned_sha256(name: str, pins: dict, known: str = "", known_source: str = "") -> tuple:
    """(sha256, where it came from): the inventory's pin wins over the knowledge base's, which is NVIDIA's or
    pyenv's published value; a file neither knows is refused with the fix."""
    pin = (pins or {}).get(name)
    if pin:
        pin = str(pin).strip().lower()
        if not _SHA256_RE.match(pin):
            raise ArtifactError("gpufleet_artifact_sha256[%r] is not a sha256 (64 hex digits): %r" % (name, pin))
        return pin, "inventory (gpufleet_artifact_sha256)"
    if known and _SHA256_RE.match(known):
        return known, known_source
    raise ArtifactError("no sha256 is known for %s: add it to gpufleet_artifact_sha256 in the inventory "
                        "(file name -> sha256, as the vendor publishes it)" % name)


def _artifact(kind: str, name: str, mirror_url: str, pins: dict, known: str = "", known_source: str = "") -> dict:
    sha256, source = pinned_sha256(name, pins, known, known_source)
    return {"name": name, "url": mirror_url_of(mirror_url, kind, name), "sha256": sha256, "sha256_source": source}


def driver(stack: dict, mirror_url: str, pins: dict) -> dict:
    version = stack.get("driver")
    if not version:
        raise ArtifactError("the stack declares no driver: set gpufleet_stack.driver (e.g. \"580.95.05\")")
    return {"version": version, "runfile": _artifact("runfile", driver_runfile_name(version), mirror_url, pins)}


def toolkit_row(kb: dict, cuda: str) -> dict:
    """The knowledge base's row for an exact toolkit release, or the newest release of a major.minor that has
    a runfile; refused with the releases it knows."""
    rows = [row for row in kb.get("cuda", []) if row.get("runfile")]
    if cuda.count(".") >= 2:
        exact = [row for row in rows if row["cuda_version"] == cuda]
    else:
        exact = sorted((row for row in rows if _major_minor(row["cuda_version"]) == cuda),
                       key=lambda row: _numeric_key(row["cuda_version"]))[-1:]
    if not exact:
        known = sorted((row["cuda_version"] for row in rows if _major_minor(row["cuda_version"]) == _major_minor(cuda)),
                       key=_numeric_key)
        raise ArtifactError("the knowledge base has no runfile for CUDA %s%s: declare a release it lists, or add "
                            "the sourced row to data/compat/cuda_driver.csv"
                            % (cuda, " (it knows %s)" % ", ".join(known) if known else ""))
    return exact[0]


def toolkit(kb: dict, cuda: str, mirror_url: str, pins: dict) -> dict:
    row = toolkit_row(kb, cuda)
    runfile = _artifact("runfile", row["runfile"], mirror_url, pins, row.get("runfile_sha256", ""),
                        "knowledge base (data/compat/cuda_driver.csv: %s)" % _first_source(row.get("source", "")))
    return {"version": row["cuda_version"], "runfile": runfile}


def toolkits(stack: dict, kb: dict, mirror_url: str, pins: dict, extra_versions: list) -> list:
    """The stack's toolkit (active, listed last) after any extra toolkits installed beside it."""
    if not stack.get("cuda"):
        return []
    active = toolkit(kb, stack["cuda"], mirror_url, pins)
    extras = [toolkit(kb, str(version), mirror_url, pins) for version in extra_versions or []]
    return [item for item in extras if item["version"] != active["version"]] + [active]


def python_release(kb: dict, python: str) -> dict:
    """'3.12' -> the pinned 3.12 release of the knowledge base; '3.12.8' -> that release, if sourced."""
    rows = kb.get("cpython", [])
    if python.count(".") >= 2:
        found = [row for row in rows if row["version"] == python]
    else:
        found = [row for row in rows if _major_minor(row["version"]) == python and row.get("default_for_minor")]
    if not found:
        known = [row["version"] for row in rows if _major_minor(row["version"]) == _major_minor(python)]
        raise ArtifactError("no sourced CPython tarball checksum for Python %s%s: declare a release listed in "
                            "data/compat/cpython.csv, or add its row (python.org URL and sha256)"
                            % (python, " (known: %s)" % ", ".join(known[-5:]) if known else ""))
    return found[0]


def python(stack: dict, kb: dict, mirror_url: str, pins: dict) -> dict:
    row = python_release(kb, stack["python"])
    tarball = _artifact("python", row["tarball"], mirror_url, pins, row["sha256"],
                        "knowledge base (data/compat/cpython.csv: %s)" % row["source"])
    return {"version": row["version"], "requested": stack["python"], "tarball": tarball}


def pyenv(version: str, mirror_url: str, pins: dict) -> dict:
    name = "pyenv-%s.tar.gz" % version
    artifact = _artifact("pyenv", name, mirror_url, pins)
    return {"version": version, "url": artifact["url"], "sha256": artifact["sha256"]}


def venv(stack: dict, options: dict) -> dict:
    """The declaration `gpufleet wheelhouse build` locks and inference_venv installs: its requirements come
    from the stack; platform, exclusions and wheel sources are the operator's options."""
    options = dict(options or {})
    package = stack.get("vllm_package") or "vllm"
    torch_requirement = "torch==%s+%s" % (stack["torch"], stack["torch_variant"])
    requirements = ([] if not stack.get("vllm") else ["%s==%s" % (package, stack["vllm"])]) + [torch_requirement]
    python_minor = _major_minor(stack["python"])
    declaration = {
        "id": options.pop("id", None) or "%s-%s-py%s" % (package if stack.get("vllm") else "torch",
                                                         stack.get("vllm") or stack["torch"],
                                                         python_minor.replace(".", "")),
        "python": python_minor,
        "platform": options.pop("platform", "manylinux_2_28_x86_64"),
        "requirements": requirements + list(options.pop("extra_requirements", [])),
    }
    if not options.get("find_links") and "torch_index_url" not in options:
        declaration["torch_index_url"] = TORCH_INDEX_URL % stack["torch_variant"]
    declaration.update(options)
    return declaration


def kernels(stack: dict, mirror_url: str, pins: dict) -> list:
    """flash-attn, when the stack declares it: built from its sdist on the mirror (PyPI's sha256 from the
    inventory's pins), never from the prebuilt wheels its setup.py would download."""
    version = stack.get("flash_attn")
    if not version:
        return []
    artifact = _artifact("sdist", "flash_attn-%s.tar.gz" % version, mirror_url, pins)
    return [{"name": "flash-attn", "version": version, "url": artifact["url"], "sha256": artifact["sha256"],
             "import_name": "flash_attn", "env": {"FLASH_ATTENTION_FORCE_BUILD": "TRUE"}}]


def resolve(stack: dict, kb: dict, mirror_url: str, pins: dict = None, extra_toolkits: list = None,
            venv_options: dict = None, pyenv_version: str = "") -> dict:
    """Everything a normalised, validated stack installs. Raises ArtifactError naming the missing fact."""
    pins = pins or {}
    resolved = {
        "driver": driver(stack, mirror_url, pins) if stack.get("driver") else None,
        "toolkits": toolkits(stack, kb, mirror_url, pins, extra_toolkits or []),
        "python": python(stack, kb, mirror_url, pins),
        "venv": venv(stack, venv_options or {}),
        "kernels": kernels(stack, mirror_url, pins),
    }
    resolved["toolkit"] = resolved["toolkits"][-1] if resolved["toolkits"] else None
    if pyenv_version:
        resolved["pyenv"] = pyenv(pyenv_version, mirror_url, pins)
    return resolved


def artifacts(resolved: dict) -> list:
    """Every file a resolved stack installs, in layer order: {layer, name, url, sha256, sha256_source}."""
    items = []
    if resolved.get("driver"):
        items.append(dict(resolved["driver"]["runfile"], layer="driver"))
    for item in resolved.get("toolkits", []):
        items.append(dict(item["runfile"], layer="toolkit"))
    if resolved.get("pyenv"):
        pyenv_item = resolved["pyenv"]
        items.append({"layer": "python", "name": pyenv_item["url"].rsplit("/", 1)[-1], "url": pyenv_item["url"],
                      "sha256": pyenv_item["sha256"], "sha256_source": "inventory (gpufleet_artifact_sha256)"})
    items.append(dict(resolved["python"]["tarball"], layer="python"))
    for item in resolved.get("kernels", []):
        items.append({"layer": "kernels", "name": item["url"].rsplit("/", 1)[-1], "url": item["url"],
                      "sha256": item["sha256"], "sha256_source": "inventory (gpufleet_artifact_sha256)"})
    return items


def _first_source(source: str) -> str:
    """The runfile's own citation out of a row's combined source column."""
    for part in source.split(" | "):
        if part.startswith("runfile:"):
            return part[len("runfile:"):].strip()
    return source


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _numeric_key(version: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))
