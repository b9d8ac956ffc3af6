"""Sub-commands of the gpufleet CLI. Each module defines `add_parser(subparsers)`.

`add_parser` registers the sub-command and sets `func` on its parser: a callable taking the parsed
arguments and returning the process exit code.
"""

# Kept explicit (no discovery magic): the order here is the order in `gpufleet --help`.
COMMAND_MODULES = (
    "lab",
    "plan",
    "wheelhouse",
    "mirror",
    "provision",
    "report",
    "demo",
    "drift",
    "rebuild",
    "upgrade",
    "cordon",
    "doctor",
    "prune",
    "completion",
)
