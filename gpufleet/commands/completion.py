"""`gpufleet completion bash`: a bash completion script for gpufleet, made from the CLI's own parser (so it never
lags behind a flag). Load it with `source <(gpufleet completion bash)`, or write it to
/etc/bash_completion.d/gpufleet."""

from __future__ import annotations

import argparse
import shlex

COMPLETION_HELP = "print a bash completion script: source <(gpufleet completion bash)"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("completion", help=COMPLETION_HELP, description=COMPLETION_HELP)
    parser.add_argument("shell", choices=["bash"], help="the shell (bash)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from gpufleet.cli import build_parser  # the whole parser, every command registered

    print(bash_script(build_parser()))
    return 0


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def flags(parser: argparse.ArgumentParser) -> list[str]:
    return sorted(option for action in parser._actions for option in action.option_strings)


def bash_script(parser: argparse.ArgumentParser) -> str:
    """A `complete -F` function: commands first, then each command's flags (and a second-level action, as lab's);
    anything else (an inventory path) falls back to file names (-o default)."""
    commands = subcommands(parser)
    cases = []
    for name, command in commands.items():
        words = flags(command) + list(subcommands(command))
        choices = [
            choice
            for action in command._actions
            if action.choices and not action.option_strings and not isinstance(action, argparse._SubParsersAction)
            for choice in action.choices
        ]
        cases.append(f"    {name}) words={shlex.quote(' '.join(words + [str(choice) for choice in choices]))};;")
    top = " ".join([*commands, *flags(parser)])
    return "\n".join(
        [
            "# bash completion for gpufleet (gpufleet completion bash)",
            "_gpufleet() {",
            '    local cur="${COMP_WORDS[COMP_CWORD]}" words=""',
            '    if [ "$COMP_CWORD" -eq 1 ]; then',
            f'        COMPREPLY=($(compgen -W {shlex.quote(top)} -- "$cur"))',
            "        return",
            "    fi",
            '    case "${COMP_WORDS[1]}" in',
            *cases,
            "    esac",
            '    if [[ "$cur" == -* || "$COMP_CWORD" -eq 2 ]]; then',
            '        COMPREPLY=($(compgen -W "$words" -- "$cur"))',
            "    fi",
            "}",
            "complete -o default -F _gpufleet gpufleet",
        ]
    )
