"""Checks of option values (Whisper options, SamplingParams): each refusal a ValueError naming
the option and what it takes."""
from __future__ import annotations

import math
import numbers
from typing import Any, Optional

import numpy as np


def is_number(value: Any, integer: bool = False) -> bool:
    """A real number (an integer with `integer`), numpy's too; bools are not numbers here."""
    kind = numbers.Integral if integer else numbers.Real
    return isinstance(value, kind) and not isinstance(value, (bool, np.bool_))


def flag(name: str, value: Any) -> bool:
    """`value` as a bool: only True and False are taken (a truthy string is no flag)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be True or False, got {value!r}")
    return bool(value)


def text(name: str, value: Any, none: bool = False) -> Optional[str]:
    """`value`, a string (or, with `none`, None)."""
    if not (isinstance(value, str) or (none and value is None)):
        raise ValueError(f"{name} must be a string{' or None' if none else ''}, got {value!r}")
    return value


def number(name: str, value: Any, low: float = -math.inf, high: float = math.inf, *,
           above: bool = False, below: bool = False, integer: bool = False, none: bool = False) -> Any:
    """`value` as a float (an int with `integer`) in [low, high], the ends left out with `above`
    and `below`; None passes with `none`. NaN and bools are refused."""
    if none and value is None:
        return None
    if not (is_number(value, integer) and (low < value if above else low <= value)
            and (value < high if below else value <= high)):
        raise ValueError(f"{name} must be {_expected(low, high, above, below, integer)}"
                         f"{' or None' if none else ''}, got {value!r}")
    return int(value) if integer else float(value)


def _expected(low: float, high: float, above: bool, below: bool, integer: bool) -> str:
    """'a number >= 0', 'in (0, 1)', 'an integer in [0, 10]', ..."""
    kind = "an integer" if integer else "a number"
    if low > -math.inf and high < math.inf:
        span = f"in {'(' if above else '['}{_bound(low)}, {_bound(high)}{')' if below else ']'}"
        return f"{kind} {span}" if integer else span
    if low > -math.inf:
        return f"{kind} {'>' if above else '>='} {_bound(low)}"
    return f"{kind} {'<' if below else '<='} {_bound(high)}" if high < math.inf else kind


def _bound(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)
