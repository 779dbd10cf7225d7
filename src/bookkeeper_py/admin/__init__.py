"""The ``bookkeeper`` command line and operator tools."""
