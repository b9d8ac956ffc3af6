"""`gpufleet doctor -i INVENTORY --limit NODE [--json]`: read a sick node (read-only) and name what is wrong.

playbooks/doctor.yml reads the node (NVML, nvidia-smi, the kernel log's XIDs, every vllm@ instance's journal,
torch_stack_info of the serving venv, loaded vs installed driver, DKMS, free disk and GPU memory, the proxy's
key, what the GPU watchdog did this boot and its cordon); its evidence is matched against data/doctor/signatures.yml. Each finding prints its evidence line, the
cause and the fix, most fundamental first.

Exit codes: 0 nothing found; 1 findings printed; 3 the node could not be read (unreachable, or the doctor's
playbook failed); 64 bad input (no such node, no inventory, a vault password missing).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any, Iterator

import yaml

from gpufleet import PROJECT_ROOT, exit_codes
from gpufleet.ansible_options import add_ansible_flags
from gpufleet.errors import GpufleetError, UsageError
from gpufleet.inventory import target_nodes
from gpufleet.runner import first_error, run_playbook

SIGNATURES = PROJECT_ROOT / "data" / "doctor" / "signatures.yml"
EXIT_HEALTHY, EXIT_FINDINGS, EXIT_UNREAD = exit_codes.OK, exit_codes.FAILED, exit_codes.INCOMPLETE
# A file system with less than this free is a finding.
LOW_DISK_MIB = 2048
EPILOG = (
    "exit codes: 0 nothing found, 1 findings printed, 3 the node could not be read (unreachable or the doctor's "
    "playbook failed), 64 bad input (unknown node, missing inventory, a vault password missing)"
)

Evidence = tuple[str, str]  # (where: "journal vllm@main", line)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "doctor",
        help="read a sick node (read-only) and print each finding's evidence, cause and fix",
        description="Read one node without changing it and match what it shows against the signature table "
        "(data/doctor/signatures.yml).",
        epilog=EPILOG,
    )
    parser.add_argument("-i", "--inventory", type=Path, required=True, help="inventory file or directory")
    parser.add_argument("--limit", required=True, metavar="NODE", help="the node to examine")
    parser.add_argument("--json", action="store_true", help="print the findings and the evidence as JSON")
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def load_signatures(path: Path = SIGNATURES) -> list[dict[str, Any]]:
    signatures = yaml.safe_load(path.read_text())["signatures"]
    for signature in signatures:
        signature["pattern"] = re.compile(signature["match"])
    return sorted(signatures, key=lambda signature: signature["rank"])


def _lines(text: Any) -> list[str]:
    return [line for line in str(text or "").splitlines() if line.strip()]


def health_evidence(health: dict[str, Any]) -> Iterator[Evidence]:
    for problem in health.get("problems") or []:
        yield "gpu_health", "%s [%s]" % (problem["message"], problem["evidence"])


def nvml_evidence(nvml: dict[str, Any]) -> Iterator[Evidence]:
    if nvml.get("failed"):
        yield "nvidia_gpu_info", str(nvml.get("msg", ""))
    for gpu in nvml.get("gpus") or []:
        if gpu.get("lost"):
            yield "nvidia_gpu_info", "GPU %s: %s" % (gpu["index"], gpu["errors"].get("gpu", "GPU is lost"))


def smi_evidence(node: dict[str, Any]) -> Iterator[Evidence]:
    smi = node.get("nvidia_smi") or {}
    if smi.get("rc") not in (0, None):
        for line in _lines(smi.get("output")):
            yield "nvidia-smi (exit %s)" % smi["rc"], line


def journal_evidence(node: dict[str, Any]) -> Iterator[Evidence]:
    for instance in node.get("instances") or []:
        for line in instance.get("journal") or []:
            yield "journal vllm@%s" % instance["name"], line


def watchdog_evidence(watchdog: dict[str, Any]) -> Iterator[Evidence]:
    """The cordon the watchdog wrote, and what it did this boot (its record, JSON lines)."""
    try:
        cordon = json.loads(watchdog.get("cordon") or "null")
    except ValueError:
        cordon = None
    if isinstance(cordon, dict) and str(cordon.get("reason", "")).startswith("gpu-watchdog: "):
        yield "cordon", "cordoned since %s: %s" % (cordon.get("since", "?"), cordon["reason"])
    boot_id = watchdog.get("boot_id") or ""
    for line in _lines(watchdog.get("records")):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("boot_id") == boot_id and record.get("action") != "log":
            yield (
                "gpu-watchdog",
                "%s at %s: %s: %s"
                % (
                    record["action"],
                    record.get("time", "?"),
                    record.get("reason", ""),
                    record.get("done", ""),
                ),
            )


def torch_evidence(torch: dict[str, Any], declared_variant: str) -> Iterator[Evidence]:
    if torch.get("failed"):
        yield "torch_stack_info", str(torch.get("msg", ""))
    for entry in torch.get("diagnosis") or []:
        if entry.get("id") == "cpu_wheel" and declared_variant == "cpu":
            continue
        yield "torch_stack_info", "%s: %s" % (entry.get("signature", entry.get("id")), entry.get("evidence", ""))


def driver_lines(evidence: dict[str, Any]) -> Iterator[str]:
    """Loaded module vs installed libraries, and DKMS for the running kernel."""
    node, nvml = evidence["node"], evidence["nvml"]
    loaded = node.get("kernel_module_version")
    installed = nvml.get("driver_version")
    if loaded and installed and loaded != installed:
        yield "the loaded kernel module %s differs from the installed libraries %s" % (loaded, installed)
    dkms = node.get("dkms") or {}
    # Only while NVML cannot reach the driver is an unbuilt DKMS module the explanation.
    if (
        nvml.get("failed")
        and dkms.get("rc") == 0
        and "nvidia" in dkms.get("output", "")
        and "installed" not in dkms.get("output", "")
    ):
        yield "DKMS has no nvidia module built for the running kernel: " + dkms["output"].splitlines()[0]


def installed_torch(torch: dict[str, Any]) -> tuple[str, str, str]:
    """(version, variant, how it reads) of the venv's torch; variant "" when none is known. A torch that does
    not import (PyPI's CUDA build without its nvidia-* libraries: "ImportError: libcudnn.so.9: cannot open shared
    object file") reports no variant; its distribution's local version names it, and none is PyPI's default build."""
    if torch.get("variant"):
        return str(torch.get("version")), str(torch["variant"]), "variant %s" % torch["variant"]
    version = str(torch.get("distribution_version") or "")
    if not version:
        return "", "", ""
    local = version.partition("+")[2]
    reads = "variant %s" % local if local else "PyPI's default build, from no variant index"
    return version, local or "pypi", reads + ", not importable"


def torch_lines(evidence: dict[str, Any]) -> Iterator[str]:
    """The venv's torch variant against the stack's declaration."""
    declared = str(evidence.get("declared_torch_variant") or "")
    version, variant, reads = installed_torch((evidence.get("torch") or {}).get("torch") or {})
    if declared and variant and variant != declared:
        yield "the serving venv has torch %s (%s) but the stack declares variant %s" % (version, reads, declared)


def instance_lines(node: dict[str, Any]) -> Iterator[str]:
    for instance in node.get("instances") or []:
        name = "vllm@%s" % instance["name"]
        if instance.get("model_exists") is False:
            yield "model directory %s of %s does not exist" % (instance["model"], name)
        key = instance.get("proxy_key")
        if key and not key["matches"]:
            yield (
                "vLLM rejects the key the proxy sends to %s: HTTP %s to GET /v1/models (proxy keys %s, vLLM "
                "requires %s)" % (name, key["http_status"], ",".join(key["proxy_key_ids"]), key["vllm_key_id"])
            )
        if instance.get("active") != "active":
            yield "%s is %s" % (name, instance.get("active"))


def resource_lines(evidence: dict[str, Any]) -> Iterator[str]:
    for disk in evidence["node"].get("disk") or []:
        if disk["free_mib"] < LOW_DISK_MIB:
            yield "%d MiB free on %s (of %d MiB)" % (disk["free_mib"], disk["path"], disk["total_mib"])


def collect_evidence(evidence: dict[str, Any]) -> dict[str, list[Evidence]]:
    """Evidence lines per source name of the signature table."""
    node_lines = [
        *driver_lines(evidence),
        *torch_lines(evidence),
        *instance_lines(evidence["node"]),
        *resource_lines(evidence),
    ]
    return {
        "health": list(health_evidence(evidence["health"])),
        "nvml": list(nvml_evidence(evidence["nvml"])),
        "nvidia_smi": list(smi_evidence(evidence["node"])),
        "journal": list(journal_evidence(evidence["node"])),
        "torch": list(torch_evidence(evidence.get("torch") or {}, str(evidence.get("declared_torch_variant") or ""))),
        "node": [("doctor", line) for line in node_lines],
        "watchdog": list(watchdog_evidence(evidence.get("watchdog") or {})),
    }


def diagnose(evidence: dict[str, Any], signatures: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One finding per signature with its first matching evidence line, most fundamental (lowest rank) first."""
    sources = collect_evidence(evidence)
    findings = []
    for signature in signatures:
        hit = next(
            (
                (where, line)
                for source in signature["in"]
                for where, line in sources.get(source, [])
                if signature["pattern"].search(line)
            ),
            None,
        )
        if hit:
            findings.append(
                {
                    "id": signature["id"],
                    "evidence": hit[1],
                    "where": hit[0],
                    "cause": signature["cause"],
                    "fix": signature["fix"],
                    "source": signature["source"],
                }
            )
    return findings


def printable(text: Any) -> str:
    """Node text (journal lines, evidence) with control characters escaped: no terminal escape reaches the screen."""
    return "".join(character if character.isprintable() else repr(character)[1:-1] for character in str(text))


def format_findings(node: str, findings: list[dict[str, Any]]) -> str:
    if not findings:
        return "%s: no known failure signature found" % node
    blocks = ["%s: %d finding(s), most likely first" % (node, len(findings))]
    for number, finding in enumerate(findings, 1):
        blocks.append(
            "%d. %s\n   evidence (%s): %s\n   cause: %s\n   fix: %s"
            % (
                number,
                finding["id"],
                printable(finding["where"]),
                printable(finding["evidence"]),
                finding["cause"],
                finding["fix"],
            )
        )
    return "\n".join(blocks)


class EvidenceCatcher:
    """ansible-runner event handler: keeps each host's gpufleet_doctor_evidence fact and why a host failed."""

    def __init__(self) -> None:
        self.evidence: dict[str, dict[str, Any]] = {}
        self.failures: dict[str, str] = {}

    def __call__(self, event: dict) -> bool:
        data = event.get("event_data") or {}
        host, result = data.get("host"), data.get("res") or {}
        if host is None:
            return True  # playbook-level events name no host
        facts = result.get("ansible_facts") or {}
        if event.get("event") == "runner_on_ok" and "gpufleet_doctor_evidence" in facts:
            self.evidence[host] = facts["gpufleet_doctor_evidence"]
        elif event.get("event") in ("runner_on_failed", "runner_on_unreachable"):
            self.failures[host] = str(result.get("msg", "failed")).strip()[:500]
        return True


def read_node(inventory: Path, node: str) -> dict[str, Any]:
    catcher = EvidenceCatcher()
    result = run_playbook(
        "doctor.yml", inventory, limit=node, quiet=True, event_handler=catcher, extravars={"doctor_hosts": "all"}
    )
    if node in catcher.evidence:
        return catcher.evidence[node]
    if not result.hosts:
        # Ansible stopped before any host (a vault password missing) or the limit matched nothing.
        error = first_error(result)
        raise UsageError(error or "no host of %s matches --limit %s" % (inventory, node))
    raise GpufleetError(
        "could not read %s: %s" % (node, catcher.failures.get(node, "ansible ended %s" % result.status)),
        exit_code=EXIT_UNREAD,
    )


def run(args: argparse.Namespace) -> int:
    nodes = target_nodes(args.inventory, args.limit)
    if nodes != [args.limit]:
        raise UsageError(f"--limit {args.limit} matches {', '.join(nodes)}: doctor reads one node; name it")
    evidence = read_node(args.inventory, args.limit)
    findings = diagnose(evidence, load_signatures())
    if args.json:
        print(json.dumps({"node": args.limit, "findings": findings, "evidence": evidence}, indent=2, default=str))
    else:
        print(format_findings(args.limit, findings))
    return EXIT_FINDINGS if findings else EXIT_HEALTHY
