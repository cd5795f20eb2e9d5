"""What counts as a refusal: a deliberate error, not a bug that happened to raise.

Where a scenario expects an error (an API contract's refusal, or one at a limit of
torch's implementation), "refused, like torch" is credited only for an exception a user
can act on: torch's own refusals are ``RuntimeError``, ``ValueError``,
``NotImplementedError``, ``TypeError`` or ``AssertionError`` with a message that says
what is wrong. An exception that Python raises for a programming error in the
candidate's own code (``'NoneType' object has no attribute 'view'`` inside a hook, a
``KeyError`` from a lookup, an index out of range) says nothing about the misuse the
scenario commits: it is no refusal, and the case is judged as the error it is (ERROR,
with the rank's traceback and the candidate's file:line). A crash is never a refusal.
"""
from __future__ import annotations

import re

#: Exception types Python raises for a program's own faults, never a deliberate refusal.
INCIDENTAL_TYPES = (AttributeError, KeyError, IndexError, NameError, UnboundLocalError,
                    ZeroDivisionError, RecursionError)
#: A TypeError in Python's own words about a value's type, a call's arity, or an object
#: pickle cannot copy (a member the candidate never meant to pickle, such as its process
#: group: it cannot pickle itself on any group); a deliberate TypeError ("expected ...,
#: got ...") is a refusal.
_PYTHON_TYPE_ERROR = re.compile(
    r"'NoneType' object|object is not (subscriptable|callable|iterable)|cannot pickle '|"
    r"unsupported operand type|takes \d+ positional argument|missing \d+ required|"
    r"got an unexpected keyword argument|object of type '.*' has no len")


class Unsupported(NotImplementedError):
    """An adapter cannot run what the scenario asks of its framework (one that takes no
    process group, on a subgroup): the case is N/A with this message, as for a missing
    capability, never an ERROR of the framework nor a refusal."""


class CannotJudge(RuntimeError):
    """An adapter's own statement that the run it was asked for cannot be what it claims
    (torch.compile that compiled no graph runs eagerly): never a refusal of the
    scenario's misuse, so never "refused, like torch"; the case is an ERROR."""


def incidental(exc: BaseException) -> bool:
    """Whether ``exc`` is a fault of the code that raised it, or an adapter's
    :class:`CannotJudge`, rather than a refusal."""
    if isinstance(exc, (*INCIDENTAL_TYPES, CannotJudge)):
        return True
    return isinstance(exc, TypeError) and bool(_PYTHON_TYPE_ERROR.search(str(exc)))
