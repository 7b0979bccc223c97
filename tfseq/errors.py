"""The errors tfseq raises for its users' mistakes (as opposed to its own bugs)."""


class InputError(ValueError):
    """Bad input files or format options; the message names the file and the fix."""
