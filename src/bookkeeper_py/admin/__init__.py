"""The ``bookkeeper`` command line and operator tools."""


class CommandError(Exception):
    """An operator's mistake a command found: the command line prints ``error: <message>`` (one
    line: what happened; what to do) and exits with status 1."""
