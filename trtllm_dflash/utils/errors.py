"""The one exception type users see: a single line naming the problem and the value."""


class DFlashError(Exception):
    """Bad input (checkpoint, model pair, request, flag). Its message is one line, no traceback."""
