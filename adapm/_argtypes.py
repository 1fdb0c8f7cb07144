"""argparse types shared by adapm's command lines (adapm-run, the apps): a bad value becomes a
usage error that names the flag, before anything starts."""

from __future__ import annotations

import argparse
import math


def _bounded(parse, low: float, inclusive: bool):
    what = "an integer" if parse is int else "a finite number"
    relation = ">=" if inclusive else ">"

    def check(text: str):
        try:
            value = parse(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not {what}: {text!r}") from None
        finite = parse is int or math.isfinite(value)
        if not finite or (value < low if inclusive else value <= low):
            raise argparse.ArgumentTypeError(f"must be {what} {relation} {low}, got {text}")
        return value

    return check


positive_int = _bounded(int, 1, inclusive=True)
non_negative_int = _bounded(int, 0, inclusive=True)
positive_float = _bounded(float, 0, inclusive=False)
non_negative_float = _bounded(float, 0, inclusive=True)


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
