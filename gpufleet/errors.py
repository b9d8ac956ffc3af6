"""The one exception type the CLI turns into a clear message and an exit code."""


class GpufleetError(Exception):
    """A failure with a message meant for the operator: what is wrong and how to fix it."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
