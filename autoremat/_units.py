"""Units below the three stages: parse the memory budgets users write, print bytes for reports.

A budget is the peak device memory of the compiled ``jax.value_and_grad(fn)``
(see ``docs/FACTS.md`` section 1; per device under sharding, each gradient laid out like its
argument: ``runtime._validate.gradient_layouts``). Accepted forms:

- a string with a unit: decimal ``"8GB"`` (KB=10**3, MB=10**6, GB=10**9,
  TB=10**12), binary ``"7.5GiB"``, ``"512MiB"``, ``"64KiB"``, or ``"1024B"``;
  the unit is case-insensitive and may follow a space;
- a positive int: a number of bytes;
- a float in (0, 1]: that fraction of the un-optimized function's peak.
"""

from __future__ import annotations

import decimal
import math
import numbers
import re

from autoremat._errors import BudgetError

__all__ = ["parse_budget", "check_budget", "format_bytes"]

_UNITS = {
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}

_STRING = re.compile(r"^\s*(?P<number>[0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(?P<unit>[A-Za-z]*)\s*$")

_ACCEPTED = (
    "accepted forms: a string with a unit such as '8GB', '7.5GiB', '512MiB', '64KiB' "
    "or '1024B' (KB/MB/GB/TB are powers of 1000, KiB/MiB/GiB/TiB powers of 1024); "
    "a positive int number of bytes; or a float in (0, 1] meaning that fraction of "
    "the un-optimized peak"
)


def parse_budget(budget: str | int | float, *, reference_peak: int | None = None) -> int:
    """Turns a memory budget into a positive number of bytes.

    Args:
      budget: ``"8GB"``, ``"7.5GiB"``, ``"512 MiB"``, ``"1024B"``, a positive int
        number of bytes, or a float in (0, 1] meaning that fraction of
        ``reference_peak``.
      reference_peak: the un-optimized peak in bytes; required for a float budget.

    Returns:
      The budget in bytes (fractions of a byte are rounded down).

    Raises:
      BudgetError: the budget is not one of the accepted forms, is not positive,
        or is a fraction without a ``reference_peak``.

    >>> parse_budget("8GB")
    8000000000
    >>> parse_budget("7.5 gib")
    8053063680
    >>> parse_budget(0.5, reference_peak=1000)
    500
    """
    if isinstance(budget, bool):
        raise BudgetError(f"budget {budget!r} is a bool, not a memory budget; {_ACCEPTED}")
    if isinstance(budget, str):
        return _parse_string(budget)
    if isinstance(budget, numbers.Integral):
        value = int(budget)
        if value <= 0:
            raise BudgetError(f"budget {budget!r} must be a positive number of bytes; {_ACCEPTED}")
        return value
    if isinstance(budget, numbers.Real):
        return _parse_fraction(float(budget), reference_peak)
    raise BudgetError(f"budget {budget!r} of type {type(budget).__name__} is not understood; {_ACCEPTED}")


def check_budget(budget) -> None:
    """Raises BudgetError if `budget` is malformed, before any reference peak is known.

    Accepts every form `parse_budget` takes, and ``"auto"`` (a fraction of the device's memory).

    >>> check_budget("eight-gigs")
    Traceback (most recent call last):
    ...
    autoremat._errors.BudgetError: budget 'eight-gigs' is not understood; accepted forms: ...
    """
    if budget is None:
        raise BudgetError("autoremat needs a budget: bytes (an int), a string such as '8GB', a fraction in (0, 1] "
                          "of the un-optimized peak, or 'auto'")
    if isinstance(budget, str) and budget.strip().lower() == "auto":
        return
    if isinstance(budget, numbers.Real) and not isinstance(budget, (bool, numbers.Integral)):
        parse_budget(budget, reference_peak=2**62)  # checks the range of a fraction
        return
    parse_budget(budget)


def _parse_string(text: str) -> int:
    match = _STRING.match(text)
    if match is None:
        raise BudgetError(f"budget {text!r} is not understood; {_ACCEPTED}")
    unit = match.group("unit").lower()
    if not unit:
        raise BudgetError(
            f"budget {text!r} has no unit; write e.g. '{match.group('number')}B' or '{match.group('number')}GB', "
            f"or pass an int number of bytes; {_ACCEPTED}"
        )
    if unit not in _UNITS:
        raise BudgetError(f"budget {text!r} has an unknown unit {match.group('unit')!r}; {_ACCEPTED}")
    value = int(decimal.Decimal(match.group("number")) * _UNITS[unit])
    if value <= 0:
        raise BudgetError(f"budget {text!r} is less than one byte; {_ACCEPTED}")
    return value


def _parse_fraction(fraction: float, reference_peak: int | None) -> int:
    if math.isnan(fraction) or math.isinf(fraction):
        raise BudgetError(f"budget {fraction!r} is not a finite number; {_ACCEPTED}")
    if fraction > 1:
        raise BudgetError(
            f"budget {fraction!r}: a float budget is a fraction in (0, 1]; "
            "for bytes pass an int or a string such as '8GB'"
        )
    if fraction <= 0:
        raise BudgetError(f"budget {fraction!r} must be positive; a float budget is a fraction in (0, 1]")
    if reference_peak is None:
        raise BudgetError(
            f"budget {fraction!r} is a fraction of the un-optimized peak, but no reference peak is known "
            "here; pass reference_peak=..., or give the budget in bytes (an int, or a string such as '8GB')"
        )
    if isinstance(reference_peak, bool) or not isinstance(reference_peak, numbers.Integral) or reference_peak <= 0:
        raise BudgetError(f"reference_peak {reference_peak!r} must be a positive int number of bytes")
    value = int(fraction * int(reference_peak))
    if value <= 0:
        raise BudgetError(
            f"budget {fraction!r} of the reference peak {format_bytes(int(reference_peak))} is less than one byte"
        )
    return value


def format_bytes(n: int | float) -> str:
    """Formats a byte count with a binary unit, for reports and error messages.

    Bytes print as integers, KiB and MiB with one decimal, GiB and TiB with two.

    >>> format_bytes(800)
    '800 B'
    >>> format_bytes(512 * 2**20)
    '512.0 MiB'
    >>> format_bytes(1.5 * 2**30)
    '1.50 GiB'
    """
    sign = "-" if n < 0 else ""
    size = abs(n)
    if size < 2**10:
        return f"{sign}{int(round(size))} B"
    if size < 2**20:
        return f"{sign}{size / 2**10:.1f} KiB"
    if size < 2**30:
        return f"{sign}{size / 2**20:.1f} MiB"
    if size < 2**40:
        return f"{sign}{size / 2**30:.2f} GiB"
    return f"{sign}{size / 2**40:.2f} TiB"
