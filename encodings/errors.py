"""Errors raised by the encoding suite.

Every error names the offending key and value, so a bad `rope_parameters` block in a user's config gives one
clear line instead of a stack trace from deep inside a tensor op.
"""


class LongRopeError(Exception):
    """The one base of every error that means "this input or this run cannot go on": the CLI catches it and prints
    its message as one line (`longrope: error: ...`, exit 2). It lives here, in the package every other imports
    (search -> workers -> encodings), so each layer's errors derive from it without an import against the arrows;
    `longrope.workers.errors` re-exports it for search/. Each subclass also keeps the builtin base callers catch
    (ValueError, RuntimeError), and library code raises it `from` the exception that caused it."""


class EncodingConfigError(LongRopeError, ValueError):
    """A positional-encoding parameter is missing, of the wrong shape, or out of range."""


class PositionOutOfRangeError(IndexError):
    """A position lies outside what an encoding can represent (e.g. past a learned table's length)."""
