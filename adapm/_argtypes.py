"""argparse types shared by adapm's command lines (adapm-run, the apps): a bad value becomes a
usage error that names the flag, before anything starts."""

from __future__ import annotations

import argparse
import math


def _bounded(parse, low: float, inclusive: bool, high=None, high_inclusive: bool = True):
    """An argparse type: ``parse``'s value (int, or a finite float) above ``low`` (or equal,
    ``inclusive``) and, if ``high`` is given, below it (or equal, ``high_inclusive``)."""
    what = "an integer" if parse is int else "a finite number"
    bound = (">=" if inclusive else ">") + f" {low}"
    if high is not None:
        bound = f"in {'[' if inclusive else '('}{low}, {high}{']' if high_inclusive else ')'}"

    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        finite = parse is int or math.isfinite(value)
        below = value < low if inclusive else value <= low
        above = high is not None and (value > high if high_inclusive else value >= high)
        if not finite or below or above:
            raise argparse.ArgumentTypeError(f"must be {what} {bound}, got {text}")
        return value

    return check


positive_int = _bounded(int, 1, inclusive=True)
non_negative_int = _bounded(int, 0, inclusive=True)
positive_float = _bounded(float, 0, inclusive=False)
non_negative_float = _bounded(float, 0, inclusive=True)


def int_in(low: int, high=None):
    """An argparse type: an integer >= ``low`` and, if given, <= ``high``."""
    return _bounded(int, low, inclusive=True, high=high)


def float_in(low: float, high=None, *, low_open: bool = False, high_open: bool = False):
    """An argparse type: a finite number >= ``low`` (> with ``low_open``) and, if given,
    <= ``high`` (< with ``high_open``)."""
    return _bounded(float, low, inclusive=not low_open, high=high, high_inclusive=not high_open)


def trace_keys(text: str):
    """``--trace-keys``: "all", a sample size N, or keys separated by commas."""
    text = text.strip()
    if text == "all":
        return text
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f'expected "all", a number of keys to sample, or keys like 1,5,9; got {text!r}'
        ) from None
    if not values:
        raise argparse.ArgumentTypeError("no keys given")
    if "," not in text:
        if values[0] < 1:
            raise argparse.ArgumentTypeError(f"a sample of {values[0]} keys: must be >= 1")
        return values[0]
    return values
