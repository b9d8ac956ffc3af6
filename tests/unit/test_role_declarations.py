"""What a role manages is declared once, in its vars/main.yml (`__<role>_managed_*`, issue 15 item 4): the role's
own tasks create each item from there and its tasks/drift.yml turns the same values into drift_probe checks. So
no drift file restates a path, a mode or a template of its own, and every declaration has both readers."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from gpufleet import PROJECT_ROOT, layers

ROLES = PROJECT_ROOT / "roles"
DRIFT_FILES = sorted({layer.drift_file for layer in layers.registry()})
# Roles whose drift compares what their tasks create (the others compare what they compute: a lock, builds).
DECLARING = (
    "base",
    "cuda_toolkit",
    "inference_proxy",
    "model_store",
    "nvidia_driver",
    "pyenv_python",
    "ray_cluster",
    "vllm_service",
)


def declarations(role: str) -> list[str]:
    variables = yaml.safe_load((ROLES / role / "vars" / "main.yml").read_text()) or {}
    return [name for name in variables if name.startswith(f"__{role}_managed_")]


def readers(role: str, name: str) -> set[str]:
    """The role's task files and templates that read the variable."""
    return {
        path.name
        for path in [*(ROLES / role / "tasks").glob("*.yml"), *(ROLES / role / "templates").rglob("*.j2")]
        if re.search(rf"\b{re.escape(name)}\b", path.read_text())
    }


@pytest.mark.parametrize("role", DECLARING)
def test_each_declaration_is_read_by_the_role_and_by_its_drift(role: str) -> None:
    names = declarations(role)
    assert names, f"{role} declares nothing it manages"
    for name in names:
        found = readers(role, name)
        assert "drift.yml" in found, f"{role}: drift.yml does not compare {name}"
        assert found - {"drift.yml"}, f"{role}: no task or template of the role uses {name}"


@pytest.mark.parametrize("path", DRIFT_FILES, ids=lambda path: str(path.relative_to(ROLES)))
def test_no_drift_file_restates_a_mode_a_path_or_a_template(path: Path) -> None:
    text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("#"))
    assert not re.search(r"""\bmode\b|['"]0[0-7]{3}['"]""", text), "a mode: take it from the role's declaration"
    assert not re.search(r"""['"]/etc/""", text), "a path under /etc: take it from the role's declaration"
    assert not re.search(r"templates/[A-Za-z]", text), "a template by name: take it from the role's declaration"
    assert "drift_roles_dir" not in text, "another role's files: a role's drift reads its own (role_path)"
