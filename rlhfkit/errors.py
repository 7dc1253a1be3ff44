"""The project's error type for mistakes a user can fix (bad file, bad flag, missing model)."""


class UserError(Exception):
    """A problem with the user's input. The CLI prints its message as one line and exits non-zero.

    Messages name what is wrong and where: the file, the line or row, and the field.
    """


class Preempted(UserError):
    """A run stopped by SIGTERM/SIGINT after checkpointing its last step; the CLI exits with ``exit_code``
    (128 + the signal's number, as a shell reports a process killed by it)."""

    def __init__(self, message: str, signum: int):
        super().__init__(message)
        self.exit_code = 128 + signum
