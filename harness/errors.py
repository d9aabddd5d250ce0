"""The one domain exception: a user error that ends with a clear message and an exit code, not a traceback."""


class HarnessError(Exception):
    """Bad input or state the user can fix; the message says what to do."""

    exit_code = 2
