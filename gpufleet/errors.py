"""The exception types the CLI turns into a clear message and an exit code (gpufleet.exit_codes)."""

from gpufleet import exit_codes


class GpufleetError(Exception):
    """A failure with a message meant for the operator: what is wrong and how to fix it."""

    def __init__(self, message: str, exit_code: int = exit_codes.FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


class UsageError(GpufleetError):
    """A mistake in the command or its inputs, found before anything changed (exit 64)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_codes.USAGE)


class BusyError(GpufleetError):
    """Another operation holds the fleet's lock or a node's lease (exit 75): run again once it ends."""

    def __init__(self, message: str) -> None:
        super().__init__(message, exit_codes.BUSY)
