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

from ansible_collections.gpufleet.fleet.plugins.module_utils.stack_index import KbIndex

MIRROR_DIRS = {
    "runfile": "nvidia",
    "fabric_manager": "nvidia",
    "python": "python",
    "pyenv": "pyenv",
    "sdist": "sdists",
    "wheels": "wheels",
}
TORCH_INDEX_URL = "https://download.pytorch.org/whl/%s"
_SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
# RFC 3986's characters only, matched in full: `$` alone matches before a final newline, and a quote, a
# backslash or a space has no place in a URL that reaches get_url, pip and the build scripts.
_MIRROR_RE = re.compile(r"(https?|file)://[A-Za-z0-9._~:/?#\[\]@!$&()*+,;=%-]+")


class ArtifactError(ValueError):
    """A stack cannot be turned into artifacts; the message names the missing fact and the fix."""


def driver_runfile_name(version: str, arch: str = "x86_64") -> str:
    """NVIDIA's file name for a driver release: NVIDIA-Linux-x86_64-580.95.05.run."""
    return "NVIDIA-Linux-%s-%s.run" % (arch, version)


def check_mirror_url(mirror_url) -> str:
    if not mirror_url or not isinstance(mirror_url, str):
        raise ArtifactError(
            "gpufleet_mirror_url is not set: declare the artifact mirror once in the inventory "
            "(group_vars/all), e.g. gpufleet_mirror_url: https://mirror.example.internal/gpufleet"
        )
    if not _MIRROR_RE.fullmatch(mirror_url):
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
    raise ArtifactError(
        "no sha256 is known for %s: add it to gpufleet_artifact_sha256 in the inventory "
        "(file name -> sha256, as the vendor publishes it)" % name
    )


class ArtifactResolver(object):
    """Resolves artifacts as the roles take them ({url, sha256}) and records each with its provenance."""

    def __init__(self, mirror_url: str, pins: dict | None):
        self.mirror_url = mirror_url
        self.pins = pins or {}
        self.listed: list[dict] = []

    def get(self, layer: str, kind: str, name: str, known: str = "", known_source: str = "") -> dict:
        sha256, source = pinned_sha256(name, self.pins, known, known_source)
        url = mirror_url_of(self.mirror_url, kind, name)
        self.listed.append({"layer": layer, "name": name, "url": url, "sha256": sha256, "sha256_source": source})
        return {"url": url, "sha256": sha256}


def driver(stack: dict, files: ArtifactResolver) -> dict:
    version = stack["driver"]
    return {"version": version, "runfile": files.get("driver", "runfile", driver_runfile_name(version))}


def driver_runfile(version: str, mirror_url: str, pins: dict) -> dict:
    """The runfile of a driver the stack does not name (a role variable set on purpose, an upgrade test)."""
    return ArtifactResolver(mirror_url, pins).get("driver", "runfile", driver_runfile_name(version))


def fabric_manager_archive_name(version: str, arch: str = "x86_64") -> str:
    """NVIDIA's redist archive of nvidia-fabricmanager for a driver release (developer.download.nvidia.com/compute/
    nvidia-driver/redist/fabricmanager/linux-x86_64/): fabricmanager-linux-x86_64-580.95.05-archive.tar.xz."""
    return "fabricmanager-linux-%s-%s-archive.tar.xz" % (arch, version)


def fabric_manager_archive(version: str, mirror_url: str, pins: dict) -> dict:
    """The fabric manager of exactly a driver's version, {url, sha256}: resolved only for an NVSwitch system, so
    a fleet without one pins no sha256 for it."""
    return ArtifactResolver(mirror_url, pins).get("driver", "fabric_manager", fabric_manager_archive_name(version))


def toolkit_row(kb: dict, cuda: str) -> dict:
    """The knowledge base's row for an exact toolkit release, or the newest release of a major.minor that has
    a runfile; refused with the releases it knows."""
    rows = [row for row in kb.get("cuda", []) if row.get("runfile")]
    if cuda.count(".") >= 2:
        exact = [row for row in rows if row["cuda_version"] == cuda]
    else:
        exact = sorted(
            (row for row in rows if _major_minor(row["cuda_version"]) == cuda),
            key=lambda row: _numeric_key(row["cuda_version"]),
        )[-1:]
    if not exact:
        named = KbIndex(kb).name_component(cuda)
        if named:
            raise ArtifactError(
                "CUDA %s is not a toolkit release: %s is the version of %s — declare the toolkit release instead"
                % (cuda, cuda, named)
            )
        known = sorted(
            (row["cuda_version"] for row in rows if _major_minor(row["cuda_version"]) == _major_minor(cuda)),
            key=_numeric_key,
        )
        raise ArtifactError(
            "the knowledge base has no runfile for CUDA %s%s: declare a release it lists, or add "
            "the sourced row to data/compat/cuda_driver.csv"
            % (cuda, " (it knows %s)" % ", ".join(known) if known else "")
        )
    return exact[0]


def toolkit(kb: dict, cuda: str, files: ArtifactResolver) -> dict:
    row = toolkit_row(kb, cuda)
    runfile = files.get(
        "toolkit",
        "runfile",
        row["runfile"],
        row.get("runfile_sha256", ""),
        "knowledge base (data/compat/cuda_driver.csv: %s)" % _runfile_source(row.get("source", "")),
    )
    return {"version": row["cuda_version"], "runfile": runfile}


def toolkits(stack: dict, kb: dict, files: ArtifactResolver, extra_versions: list) -> list:
    """The stack's toolkit (active, listed last) after any extra toolkits installed beside it."""
    if not stack.get("cuda"):
        return []
    extras = [str(version) for version in extra_versions or [] if str(version) != stack["cuda"]]
    return [toolkit(kb, version, files) for version in extras] + [toolkit(kb, stack["cuda"], files)]


def python_release(kb: dict, python: str) -> dict:
    """'3.12' -> the pinned 3.12 release of the knowledge base; '3.12.8' -> that release, if sourced."""
    rows = kb.get("cpython", [])
    if python.count(".") >= 2:
        found = [row for row in rows if row["version"] == python]
    else:
        found = [row for row in rows if _major_minor(row["version"]) == python and row.get("default_for_minor")]
    if not found:
        known = [row["version"] for row in rows if _major_minor(row["version"]) == _major_minor(python)]
        raise ArtifactError(
            "no sourced CPython tarball checksum for Python %s%s: declare a release listed in "
            "data/compat/cpython.csv, or add its row (python.org URL and sha256)"
            % (python, " (known: %s)" % ", ".join(known[-5:]) if known else "")
        )
    return found[0]


def python(stack: dict, kb: dict, files: ArtifactResolver) -> dict:
    row = python_release(kb, stack["python"])
    tarball = files.get(
        "python",
        "python",
        row["tarball"],
        row["sha256"],
        "knowledge base (data/compat/cpython.csv: %s)" % row["source"],
    )
    return dict(tarball, version=row["version"])


def pyenv(version: str, files: ArtifactResolver) -> dict:
    return dict(files.get("python", "pyenv", "pyenv-%s.tar.gz" % version), version=version)


def venv(stack: dict, options: dict) -> dict:
    """The declaration `gpufleet wheelhouse build` locks and inference_venv installs: its requirements come
    from the stack; exclusions and wheel sources are the operator's options. The platform is the options' or the
    stack's (the one the plan checked the wheels against); two that differ are refused."""
    options = dict(options or {})
    declared = stack.get("platform")
    if declared and options.get("platform") and options["platform"] != declared:
        raise ArtifactError(
            "inference_venv_stack_options.platform %s contradicts the stack's platform %s (the one the plan "
            "checked the wheels against) — declare the nodes' platform once" % (options["platform"], declared)
        )
    package = stack.get("vllm_package") or "vllm"
    requirements = ["%s==%s" % (package, stack["vllm"])] if stack.get("vllm") else []
    requirements.append("torch==%s+%s" % (stack["torch"], stack["torch_variant"]))
    python_minor = _major_minor(stack["python"])
    declaration = {
        "id": "%s-%s-py%s" % (package, stack["vllm"], python_minor.replace(".", ""))
        if stack.get("vllm")
        else "torch-%s-%s-py%s" % (stack["torch"], stack["torch_variant"], python_minor.replace(".", "")),
        "python": python_minor,
        "platform": declared or DEFAULT_PLATFORM,
        "requirements": requirements + [str(item) for item in options.pop("extra_requirements", [])],
    }
    if not options.get("find_links") and not options.get("torch_index_url"):
        declaration["torch_index_url"] = TORCH_INDEX_URL % stack["torch_variant"]
    declaration.update(options)
    return declaration


def kernels(stack: dict, files: ArtifactResolver) -> list:
    """flash-attn, when the stack declares it: built from its sdist on the mirror (PyPI's sha256 from the
    inventory's pins), never from the prebuilt wheels its setup.py would download."""
    version = stack.get("flash_attn")
    if not version:
        return []
    sdist = files.get("kernels", "sdist", "flash_attn-%s.tar.gz" % version)
    return [
        dict(
            sdist,
            name="flash-attn",
            version=version,
            import_name="flash_attn",
            env={"FLASH_ATTENTION_FORCE_BUILD": "TRUE"},
        )
    ]


def resolve(
    stack: dict,
    kb: dict,
    mirror_url: str,
    pins: dict | None = None,
    extra_toolkits: list | None = None,
    venv_options: dict | None = None,
    pyenv_version: str = "",
) -> dict:
    """Everything a normalised, validated stack installs, and `artifacts`: every file in layer order with
    where its sha256 came from. Raises ArtifactError naming the missing fact."""
    files = ArtifactResolver(mirror_url, pins)
    resolved = {
        "driver": driver(stack, files) if stack.get("driver") else None,
        "toolkits": toolkits(stack, kb, files, extra_toolkits or []),
    }
    resolved["toolkit"] = resolved["toolkits"][-1] if resolved["toolkits"] else None
    if pyenv_version:
        resolved["pyenv"] = pyenv(pyenv_version, files)
    resolved["python"] = python(stack, kb, files)
    resolved["venv"] = venv(stack, venv_options or {})
    resolved["kernels"] = kernels(stack, files)
    resolved["artifacts"] = files.listed
    return resolved


def _runfile_source(source: str) -> str:
    """The runfile's own citation out of a row's combined source column."""
    for part in source.split(" | "):
        if part.startswith("runfile:"):
            return part[len("runfile:") :].strip()
    return source


def _major_minor(version: str) -> str:
    return ".".join(version.split(".")[:2])


def _numeric_key(version: str) -> tuple:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


# ---------------------------------------------------------------------------------------------------
# The nodes' platform: an architecture and a glibc, as a manylinux tag names them, and the wheels that fit it.
# A wheel installs on a node when its architecture is the node's, its manylinux glibc floor is at most the node's
# glibc (PEP 600: manylinux_2_28 runs on glibc 2.28 and newer; manylinux1/2010/2014 are glibc 2.5/2.12/2.17) and its
# Python tag is one the node's CPython takes. The refresh (gpufleet/compat_refresh.py) reads wheel file names with
# the same rules.

PLATFORM_RE = re.compile(r"^manylinux_(\d+)_(\d+)_(x86_64|aarch64)$", re.ASCII)
ARCHES = ("x86_64", "aarch64")
# What a stack without a platform gets: the wheelhouse's platform when inference_venv_stack_options sets none.
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
_LEGACY_TAGS = {"manylinux1": (2, 5), "manylinux2010": (2, 12), "manylinux2014": (2, 17)}
_TAG_RE = re.compile(r"^(manylinux1|manylinux2010|manylinux2014|manylinux_(\d+)_(\d+))_(x86_64|aarch64|i686)$")


def parse_platform(platform: str):
    """'manylinux_2_39_aarch64' -> ('aarch64', (2, 39)); None when it is not such a tag."""
    match = PLATFORM_RE.match(str(platform or ""))
    if not match:
        return None
    return match.group(3), (int(match.group(1)), int(match.group(2)))


def glibc_text(glibc) -> str:
    """(2, 39) -> '2.39'; None (not declared) -> 'unknown'."""
    return "%d.%d" % tuple(glibc) if glibc else "unknown"


def parse_floor(text: str):
    """'2.28' -> (2, 28); 'any' (a pure-Python wheel) -> (0, 0); '' -> None."""
    if text == "any":
        return (0, 0)
    match = re.match(r"^(\d+)\.(\d+)$", text or "")
    return (int(match.group(1)), int(match.group(2))) if match else None


def wheel_tag_floor(platform_tags: str, arch: str) -> str:
    """The glibc floor of one wheel for `arch` from its platform tag set ('manylinux_2_17_x86_64.manylinux2014_x86_64'
    -> '2.17'; 'any' -> 'any'); '' when the wheel is not for a glibc Linux of that architecture."""
    floors = []
    for tag in platform_tags.split("."):
        if tag == "any":
            return "any"
        match = _TAG_RE.match(tag)
        if not match or match.group(4) != arch:
            continue
        if match.group(2) is not None:
            floors.append((int(match.group(2)), int(match.group(3))))
        else:
            floors.append(_LEGACY_TAGS[match.group(1)])
    return glibc_text(min(floors)) if floors else ""


def python_tag_installs(tag: str, python: str) -> bool:
    """Whether CPython `python` (3.12) installs a wheel of Python tag `tag` ('cp312-cp312', 'cp38-abi3',
    'py3-none')."""
    major, minor = python.split(".")[:2]
    wanted = "cp%s%s" % (major, minor)
    interpreter, dummy, abi = tag.partition("-")
    if interpreter == wanted and abi == wanted:
        return True
    if abi == "none" and interpreter in ("py3", "py%s" % major, wanted):
        return True  # a pure-Python wheel (py3-none-any) installs on every CPython 3
    return bool(
        abi == "abi3"
        and interpreter.startswith("cp")
        and interpreter[2:3] == major
        and interpreter[3:].isdigit()
        and int(interpreter[3:]) <= int(minor)
    )


def wheel_entries(row: dict) -> list:
    """The `wheels` column ('cp38-abi3:2.28;cp311-cp311:2.17') as [(python tag, floor text)]."""
    entries = []
    for item in [part for part in row.get("wheels", "").split(";") if part]:
        tag, dummy, floor = item.rpartition(":")
        entries.append((tag, floor))
    return entries


def wheel_for(row: dict, python, glibc) -> dict:
    """What a wheel_platforms row offers a node: {'fits': a wheel for the Python (when given) with a floor <= glibc
    (when given), 'python_floors': the floors of the wheels for that Python, 'floors': every floor}."""
    entries = wheel_entries(row)
    for_python = [floor for tag, floor in entries if python is None or python_tag_installs(tag, python)]
    fits = [floor for floor in for_python if glibc is None or parse_floor(floor) <= glibc]
    return {"fits": bool(fits), "python_floors": for_python, "floors": [floor for dummy, floor in entries]}


def lowest_floor(floors: list) -> str:
    known = [floor for floor in floors if parse_floor(floor) is not None]
    return min(known, key=parse_floor) if known else ""


def platform_text(arch: str, glibc) -> str:
    """The manylinux tag of a node ('manylinux_2_39_aarch64'), or the architecture alone when its glibc is unknown."""
    return "manylinux_%d_%d_%s" % (glibc[0], glibc[1], arch) if glibc is not None else arch
