"""The project's error type for mistakes a user can fix (bad file, bad flag, missing model)."""


class UserError(Exception):
    """A problem with the user's input. The CLI prints its message as one line and exits non-zero.

    Messages name what is wrong and where: the file, the line or row, and the field.
    """
