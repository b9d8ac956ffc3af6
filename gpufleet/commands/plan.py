"""`gpufleet plan --stack FILE [--json]`: check a declared GPU stack against the sourced version chain.

Exit 0 when every link holds (warnings allowed), 2 when a link is broken or the stack file is invalid.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from gpufleet import compat, fleet_plan
from gpufleet.ansible_options import add_ansible_flags
from gpufleet.stack_file import load_stack_file

INCOMPATIBLE_EXIT_CODE = 2


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan",
        help="check a GPU stack (GPU, driver, CUDA, Python, torch, vLLM, flash-attn) before touching any host",
        description="Validate every link of a stack file, or of every stack an inventory declares (as preflight "
        "does, with the artifacts each GPU class installs), against data/compat. Exit 0: compatible; "
        "2: incompatible, invalid or contradicted by a role variable.",
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--stack",
        type=Path,
        metavar="FILE",
        help="YAML file with keys gpu, driver, cuda, python, torch, torch_variant, vllm [, flash_attn, vllm_package]",
    )
    source.add_argument(
        "-i",
        "--inventory",
        type=Path,
        metavar="INVENTORY",
        help="validate the stack of every host of this inventory (group gpu_nodes)",
    )
    parser.add_argument("--limit", help="with -i: only these hosts (an Ansible pattern)")
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the report as JSON (schema gpufleet.plan/v1, with -i gpufleet.fleet-plan/v1)",
    )
    parser.add_argument(
        "--kb-dir",
        type=Path,
        default=None,
        metavar="DIR",
        help="knowledge base directory (default: $GPUFLEET_COMPAT_DIR or data/compat)",
    )
    add_ansible_flags(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    if args.inventory is not None:
        return run_inventory(args)
    stack = load_stack_file(args.stack)
    kb = compat.load_knowledge_base(args.kb_dir)
    report = compat.stack_declared().validate_stack(stack, kb)
    document = plan_document(args.stack, kb, report)
    emit(json.dumps(document, indent=2, sort_keys=True) if args.json else render(document))
    return 0 if report["compatible"] else INCOMPATIBLE_EXIT_CODE


def run_inventory(args: argparse.Namespace) -> int:
    envvars = {"GPUFLEET_COMPAT_DIR": str(args.kb_dir)} if args.kb_dir else None
    document = fleet_plan.document(args.inventory, fleet_plan.plan_inventory(args.inventory, args.limit, envvars))
    emit(json.dumps(document, indent=2, sort_keys=True) if args.json else fleet_plan.render(document))
    return 0 if document["compatible"] else INCOMPATIBLE_EXIT_CODE


def emit(text: str) -> None:
    """Print the report; a reader that stops early (`| head`) is not an error of the plan."""
    try:
        print(text)
        sys.stdout.flush()
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


def plan_document(stack_file: Path, kb: dict[str, Any], report: dict[str, Any]) -> dict[str, Any]:
    """The stable --json schema: the validator's report plus where the stack and the facts came from."""
    return {
        "schema": "gpufleet.plan/v1",
        "stack_file": str(stack_file),
        "knowledge_base": kb["kb_dir"],
        "compatible": report["compatible"],
        "stack": report["stack"],
        "resolved": report["resolved"],
        "errors": report["errors"],
        "warnings": report["warnings"],
        "facts": report["facts"],
    }


def render(document: dict[str, Any]) -> str:
    """Human output: the verdict, every error and warning with its link, then the facts with sources."""
    errors, warnings = document["errors"], document["warnings"]
    verdict = "COMPATIBLE" if document["compatible"] else "NOT COMPATIBLE"
    lines = [
        f"stack {document['stack_file']}: {describe(document)}",
        f"{verdict}: {len(errors)} error(s), {len(warnings)} warning(s)",
    ]
    for title, entries in (("errors", errors), ("warnings", warnings)):
        if entries:
            lines.append(f"{title}:")
            lines.extend(f"  [{entry['link']}] {entry['message']}" for entry in entries)
    lines.append(f"facts used (knowledge base {document['knowledge_base']}):")
    for fact in document["facts"]:
        lines.append(f"  - {fact['statement']}")
        lines.append(f"    source: {fact['source']}")
    return "\n".join(lines)


def describe(document: dict[str, Any]) -> str:
    stack, resolved = document["stack"], document["resolved"]
    counts: dict[str, int] = {}
    for gpu in resolved["gpus"]:
        label = f"{gpu['model']} ({gpu['compute_capability']})"
        counts[label] = counts.get(label, 0) + 1
    gpus = ", ".join(label if count == 1 else f"{count} x {label}" for label, count in counts.items()) or "none"
    parts = [
        f"gpu {gpus}",
        f"driver {stack['driver'] or '-'}",
        f"cuda {stack['cuda'] or '-'}",
        f"python {stack['python']}",
        f"torch {stack['torch']}+{stack['torch_variant']}" if "+" not in stack["torch"] else f"torch {stack['torch']}",
        f"{stack['vllm_package']} {stack['vllm'] or '-'}",
        f"flash-attn {stack['flash_attn'] or '-'}",
    ]
    return "; ".join(parts)
