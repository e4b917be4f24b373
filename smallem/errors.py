"""The one exception smallem raises for a user's mistake.

Its message is a single sentence saying what was wrong and what to do; the command line
prints it without a traceback.
"""


class SmallemError(Exception):
    """A user-facing error: bad input, a shape that does not fit, a missing device."""
