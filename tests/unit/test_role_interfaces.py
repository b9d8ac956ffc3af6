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
    undeclared = sorted(set(defaults) - set(options))
    assert undeclared == [], f"{role}: defaults/main.yml sets variables its argument specs do not declare"
    documented = sorted(name for name, spec in options.items() if "default" in spec)
    assert set(documented) <= set(defaults), f"{role}: argument specs give defaults that defaults/main.yml does not"
    for name, value in defaults.items():
        spec = options[name]
        if "default" in spec:
            assert spec["default"] == value, f"{role}: default of {name} differs between the two files"
        else:
            # A computed default of a typed option stays in defaults/main.yml alone (a Jinja string is no valid
            # dict, list, bool or int: antsibull-docs refuses the page) and the description says where it is.
            assert _computed(value) and spec.get("type") not in ("str", "path", "raw", None), name
            assert "C(defaults/main.yml)" in " ".join(_list(spec["description"])), name


def _computed(value: object) -> bool:
    return isinstance(value, str) and "{{" in value


def _list(value: object) -> list[str]:
    return value if isinstance(value, list) else [str(value)]


@pytest.mark.parametrize("role", ROLES_WITH_DEFAULTS)
def test_documented_defaults_are_values_of_their_type(role: str) -> None:
    """What antsibull-docs checks of a role page: a default of a typed option is a value of that type, so a
    computed one (a Jinja string) is left out of the argument specs (above)."""
    for entry_point in _load(ROLES_DIR / role / "meta" / "argument_specs.yml")["argument_specs"].values():
        for name, spec in (entry_point.get("options") or {}).items():
            if spec.get("type") in ("dict", "list", "bool", "int", "float") and "default" in spec:
                assert not _computed(spec["default"]), f"{role}: {name} documents a Jinja string as its default"


@pytest.mark.parametrize("role", ROLES_WITH_DEFAULTS)
def test_public_variables_carry_the_role_prefix(role: str) -> None:
    defaults = _load(ROLES_DIR / role / "defaults" / "main.yml")
    unprefixed = [name for name in defaults if not name.startswith(f"{role}_")]
    assert unprefixed == [], f"{role}: variables without the role prefix: {unprefixed}"
