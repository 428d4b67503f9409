"""The plain-integer fast path of ``quantity_as_int64`` / ``parse_quantity`` (taken on every pod event)
gives exactly what the general parser gives, and leaves everything else to it."""

import pytest

from hami_agent.protocol import quantity as q
from hami_agent.protocol.errors import ProtocolError


def general_exact(value: str) -> q.Fraction:
    """The general path (regex + suffix table), spelled out without the fast path."""
    m = q._QUANTITY_RE.match(value.strip())  # noqa: SLF001
    assert m is not None
    exact = q.Fraction(m.group(2)) * q._SUFFIX[m.group(3) or ""]  # noqa: SLF001
    return -exact if m.group(1) == "-" else exact


def general_as_int64(value: str) -> int | None:
    exact = general_exact(value)
    if exact.denominator != 1 or not -(2**63) <= exact.numerator <= q.INT64_MAX:
        return None
    return exact.numerator


@pytest.mark.parametrize("value", ["0", "1", "007", "4096", "81920", "999999999999999999",
                                   "9223372036854775807", "9223372036854775808", "1Gi", "500m", "2k", "-3"])
def test_fast_path_agrees_with_the_general_parser(value):
    assert q.quantity_as_int64(value) == general_as_int64(value)
    assert q.parse_quantity(value) == general_exact(value)


@pytest.mark.parametrize("value", ["\u00b2", "", "+", "1" * 65])
def test_non_ascii_digits_empty_and_long_strings_are_still_refused(value):  # "\u00b2".isdigit() is True
    with pytest.raises(ProtocolError, match="quantity"):
        q.quantity_as_int64(value, "quantity")


def test_blanks_around_digits_take_the_general_path():
    assert q.quantity_as_int64(" 12 ") == 12


@pytest.mark.parametrize("value", ["\u0663", "\u0663Gi", "1\u0660", "\uff11Mi", "1e\u0663"])
def test_non_ascii_digits_are_not_a_quantity(value):
    """Kubernetes' ParseQuantity takes 0-9 only; Python's \\d (and str.isdigit) take any Unicode digit."""
    with pytest.raises(ProtocolError, match="not a Kubernetes quantity"):
        q.parse_quantity(value)
    with pytest.raises(ProtocolError):
        q.quantity_as_int64(value)
