"""The one set of config checks: predicates and `check`, which raises one line naming the
field, its value and what is allowed.

    check(is_int(c.num_steps) and c.num_steps >= 1, "num_steps", c.num_steps, "an integer >= 1")
    # ValueError: config.num_steps=0 is invalid; allowed: an integer >= 1

Studies pass `error=StudyError` (a ValueError) so their binaries print it as one line.
"""

from __future__ import annotations

import math
from typing import Any


def check(cond: bool, field: str, value: Any, allowed: str, *,
          error: type[Exception] = ValueError, prefix: str = "config.") -> None:
    """Raise `error("<prefix><field>=<value!r> is invalid; allowed: <allowed>")` unless
    `cond`."""
    if not cond:
        raise error(f"{prefix}{field}={value!r} is invalid; allowed: {allowed}")


def is_number(x: Any) -> bool:
    """A real finite number (bools are not numbers here: `True` is no learning rate)."""
    return isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x)


def is_int(x: Any) -> bool:
    """An int that is not a bool."""
    return isinstance(x, int) and not isinstance(x, bool)


def is_positive_int(x: Any) -> bool:
    """An int >= 1 (not a bool)."""
    return is_int(x) and x >= 1


def is_bool(x: Any) -> bool:
    """Exactly True or False (not 0/1)."""
    return isinstance(x, bool)


__all__ = ["check", "is_bool", "is_int", "is_number", "is_positive_int"]
