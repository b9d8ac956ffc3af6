"""`gpufleet completion bash` (issue 30): a completion script made from the parser, run by bash itself."""

from __future__ import annotations

import subprocess

import pytest

from gpufleet import PROJECT_ROOT

GPUFLEET = str(PROJECT_ROOT / ".venv" / "bin" / "gpufleet")


def complete(*words: str) -> list[str]:
    """What bash offers for the last word of `gpufleet WORDS...`, through the generated function."""
    quoted = " ".join(f"'{word}'" for word in ("gpufleet", *words))
    script = f'source <("{GPUFLEET}" completion bash)\nCOMP_WORDS=({quoted})\nCOMP_CWORD={len(words)}\n_gpufleet\n'
    script += 'printf "%s\\n" "${COMPREPLY[@]}"'
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True, timeout=60)
    return [line for line in result.stdout.splitlines() if line]


@pytest.mark.parametrize(
    ("words", "offered"),
    [
        (["pro"], ["provision"]),
        (["provision", "--sk"], ["--skip-tags"]),
        (["upgrade", "-i", "hosts.yml", "--pl"], ["--plan"]),
        (["lab", "u"], ["up"]),
        (["cordon", "--li"], ["--limit"]),
        (["completion", "b"], ["bash"]),
    ],
)
def test_bash_offers_the_parsers_commands_and_flags(words: list[str], offered: list[str]) -> None:
    assert complete(*words) == offered


def test_the_script_registers_the_function_with_file_names_as_the_fallback() -> None:
    script = subprocess.run([GPUFLEET, "completion", "bash"], capture_output=True, text=True, check=True).stdout
    assert script.rstrip().endswith("complete -o default -F _gpufleet gpufleet")
