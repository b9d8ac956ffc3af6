"""Every role declares its interface in meta/argument_specs.yml, in sync with defaults/main.yml."""

from pathlib import Path

import pytest
import yaml

ROLES_DIR = Path(__file__).resolve().parents[2] / "roles"
ROLES_WITH_DEFAULTS = sorted(p.parent.parent.name for p in ROLES_DIR.glob("*/defaults/main.yml"))


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text()) or {}


def test_some_role_is_checked() -> None:
    assert "base" in ROLES_WITH_DEFAULTS


@pytest.mark.parametrize("role", ROLES_WITH_DEFAULTS)
def test_argument_specs_match_defaults(role: str) -> None:
    defaults = _load(ROLES_DIR / role / "defaults" / "main.yml")
    specs_file = ROLES_DIR / role / "meta" / "argument_specs.yml"
    assert specs_file.exists(), f"{role} has defaults but no meta/argument_specs.yml"
    # Every entry point (main, and a tasks_from such as artifact's prune) reads the same defaults file.
    options: dict = {}
    for entry_point in _load(specs_file)["argument_specs"].values():
        options.update(entry_point.get("options") or {})
    assert sorted(defaults) == sorted(k for k, v in options.items() if "default" in v), (
        f"{role}: defaults/main.yml and meta/argument_specs.yml declare different variables"
    )
    for name, value in defaults.items():
        assert options[name]["default"] == value, f"{role}: default of {name} differs between the two files"


@pytest.mark.parametrize("role", ROLES_WITH_DEFAULTS)
def test_public_variables_carry_the_role_prefix(role: str) -> None:
    defaults = _load(ROLES_DIR / role / "defaults" / "main.yml")
    unprefixed = [name for name in defaults if not name.startswith(f"{role}_")]
    assert unprefixed == [], f"{role}: variables without the role prefix: {unprefixed}"
