"""Errors raised by the encoding suite.

Every error names the offending key and value, so a bad `rope_parameters` block in a user's config gives one
clear line instead of a stack trace from deep inside a tensor op.
"""


class EncodingConfigError(ValueError):
    """A positional-encoding parameter is missing, of the wrong shape, or out of range."""


class PositionOutOfRangeError(IndexError):
    """A position lies outside what an encoding can represent (e.g. past a learned table's length)."""
