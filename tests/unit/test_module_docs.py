"""Every module's DOCUMENTATION, EXAMPLES and RETURN are YAML that ansible-doc can read (a colon inside a
plain scalar silently broke one: ansible-lint and ansible-doc then report nothing about the module's options)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml

MODULES = sorted((Path(__file__).resolve().parents[2] / "plugins/modules").glob("*.py"))
DOC_BLOCKS = ("DOCUMENTATION", "EXAMPLES", "RETURN")


def doc_blocks(path: Path) -> dict[str, str]:
    blocks = {}
    for node in ast.parse(path.read_text()).body:
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Name)
            and node.targets[0].id in DOC_BLOCKS
            and isinstance(node.value, ast.Constant)
        ):
            blocks[node.targets[0].id] = node.value.value
    return blocks


@pytest.mark.parametrize("path", MODULES, ids=[path.stem for path in MODULES])
def test_module_documentation_is_yaml(path: Path) -> None:
    blocks = doc_blocks(path)
    assert set(blocks) == set(DOC_BLOCKS), f"{path.name} lacks {set(DOC_BLOCKS) - set(blocks)}"
    for name, text in blocks.items():
        yaml.safe_load(text)
    documentation = yaml.safe_load(blocks["DOCUMENTATION"])
    assert documentation["module"] == path.stem
