"""Kubernetes resource quantities (``500m``, ``16Gi``, ``1e3``): syntax check and comparison.

Only what validation needs: the CRDs' quantity pattern, and an exact decimal value so that a
request can be compared with a limit (``1Gi`` versus ``1073741824``).
"""

from __future__ import annotations

import re
from decimal import Context, Decimal, DecimalException, localcontext
from typing import Final

# The pattern every CRD here puts on quantities (resources.limits / requests, sizeLimit).
QUANTITY_PATTERN: Final = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?\Z"
)

_BINARY: Final = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL: Final = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
_CONTEXT: Final = Context(prec=40, Emax=10**6, Emin=-(10**6))
_NUMBER: Final = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)")


def is_quantity(text: str) -> bool:
    """Whether ``text`` is a Kubernetes quantity the CRDs accept."""
    return QUANTITY_PATTERN.match(text) is not None


def parse_quantity(text: str) -> Decimal:
    """The exact value of a quantity, in base units (cores, bytes, devices).

    Args:
        text: A quantity such as ``500m``, ``16Gi`` or ``1e3``.

    Raises:
        ValueError: If ``text`` is not a quantity, or too large to compute.

    Example:
        >>> parse_quantity("1Gi") == parse_quantity("1073741824")
        True
    """
    if not is_quantity(text):
        raise ValueError(f"not a Kubernetes quantity: {text!r}")
    number = _NUMBER.match(text)
    assert number is not None  # guaranteed by QUANTITY_PATTERN
    value = Decimal(number.group(0))
    suffix = text[number.end() :]
    if not suffix:
        return value
    if suffix in _BINARY:
        return value * _BINARY[suffix]
    if suffix in _DECIMAL:
        return value * _DECIMAL[suffix]
    try:  # e/E exponent: "1e400000000" would overflow the default decimal context
        with localcontext(_CONTEXT):
            return value.scaleb(int(suffix[1:]))
    except (DecimalException, ValueError) as exc:
        raise ValueError(f"quantity out of range: {text!r}") from exc
