"""gpufleet's exit codes: one table, printed by `gpufleet --help` and kept in the README (a unit test compares them).

A usage mistake (a flag, a tag, a node or an inventory gpufleet cannot use) exits 64, sysexits' EX_USAGE, so that
scripts never read a mistyped flag as "drift found" (2).
"""

from __future__ import annotations

OK, FAILED, FOUND, INCOMPLETE, USAGE, BUSY, INTERRUPTED, PIPE_CLOSED = 0, 1, 2, 3, 64, 75, 130, 141

TABLE: tuple[tuple[int, str], ...] = (
    (OK, "done, or nothing found: drift clean, plan compatible, doctor found nothing"),
    (FAILED, "a run failed on some host; doctor printed findings; drift found nothing but did not compare everything"),
    (
        FOUND,
        "drift found (every node compared); plan: the stack is incompatible; upgrade --plan: some node would change; "
        "rebuild: drift no playbook rebuilds",
    ),
    (INCOMPLETE, "drift found and some node could not be compared; doctor could not read the node"),
    (
        USAGE,
        "a mistake in the command or its inputs, nothing was changed: an unknown flag, tag, layer or node, an "
        "inventory that is missing or does not parse, no gpu_nodes group, a vault password missing",
    ),
    (BUSY, "another gpufleet operation holds the fleet's lock or a node's lease: wait for it, then run again"),
    (INTERRUPTED, "interrupted (Ctrl-C)"),
    (PIPE_CLOSED, "the reader of the output went away (`| head`)"),
)


def help_text() -> str:
    """The table as `gpufleet --help` ends."""
    return "exit codes:\n" + "\n".join(f"  {code:>3}  {meaning}" for code, meaning in TABLE)


def markdown() -> str:
    """The table as the README holds it."""
    rows = [f"| {code} | {meaning} |" for code, meaning in TABLE]
    return "\n".join(["| exit | meaning |", "|---|---|", *rows])
