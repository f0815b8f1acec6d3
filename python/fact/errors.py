"""Errors FACT reports to the user.

Every failure a user can cause or fix is a `FactError`; the CLI prints its message as
``fact: error: <message>`` and exits 2, so messages are written for people: they name the file or
node at fault and say what to do. Anything else escaping is a bug in FACT.
"""

from __future__ import annotations


class FactError(Exception):
    """A failure the user can act on; the message is shown as is, without a traceback."""


class ProblemError(FactError):
    """A problem file could not be loaded (missing, not importable, wrong shape)."""


class TraceError(FactError):
    """torch.export could not capture the model."""


class GraphError(FactError):
    """A graph file is missing, unreadable or not a FACT graph."""


class EngineNotFoundError(FactError):
    """The `fact-engine` binary is not built or not where FACT looks."""


class EngineError(FactError):
    """`fact-engine` refused its input (exit status 2); the message is the engine's."""


class EngineCrashError(FactError):
    """`fact-engine` failed unexpectedly (an internal error, worth reporting)."""
