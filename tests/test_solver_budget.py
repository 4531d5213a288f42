"""parse_budget and format_bytes: every accepted form and every rejection."""

import math

import numpy as np
import pytest

from autoremat._errors import BudgetError
from autoremat._units import format_bytes, parse_budget


@pytest.mark.parametrize(
    "budget, expected",
    [
        ("8GB", 8 * 10**9),
        ("8gb", 8 * 10**9),
        ("8 GB", 8 * 10**9),
        (" 8GB ", 8 * 10**9),
        ("1.5KB", 1500),
        ("2MB", 2 * 10**6),
        ("3TB", 3 * 10**12),
        ("7.5GiB", int(7.5 * 2**30)),
        ("7.5 gib", int(7.5 * 2**30)),
        ("512MiB", 512 * 2**20),
        ("64KiB", 64 * 2**10),
        ("1TiB", 2**40),
        ("1024B", 1024),
        ("1024 b", 1024),
        (".5KiB", 512),
        ("2.KB", 2000),
        ("1.0000001GB", 1000000100),
        (1, 1),
        (8 * 10**9, 8 * 10**9),
        (np.int64(4096), 4096),
    ],
)
def test_accepted_forms(budget, expected):
    assert parse_budget(budget) == expected


@pytest.mark.parametrize(
    "fraction, reference, expected",
    [(0.5, 1000, 500), (1.0, 1000, 1000), (0.25, 2**30, 2**28), (np.float32(0.5), 10, 5), (1e-3, 10**6, 1000)],
)
def test_fraction_of_reference_peak(fraction, reference, expected):
    assert parse_budget(fraction, reference_peak=reference) == expected


@pytest.mark.parametrize(
    "budget, match",
    [
        (True, r"budget True is a bool"),
        (False, r"budget False is a bool"),
        (0, r"budget 0 must be a positive number of bytes"),
        (-5, r"budget -5 must be a positive number of bytes"),
        (0.0, r"budget 0\.0 must be positive"),
        (-0.5, r"budget -0\.5 must be positive"),
        (math.nan, r"budget nan is not a finite number"),
        (math.inf, r"budget inf is not a finite number"),
        (1.5, r"a float budget is a fraction in \(0, 1\]; for bytes pass an int or a string such as '8GB'"),
        (8e9, r"a float budget is a fraction in \(0, 1\]"),
        ("8XB", r"budget '8XB' has an unknown unit 'XB'"),
        ("8 gigabytes", r"unknown unit 'gigabytes'"),
        ("1024", r"budget '1024' has no unit"),
        ("", r"budget '' is not understood"),
        ("GB", r"budget 'GB' is not understood"),
        ("-8GB", r"budget '-8GB' is not understood"),
        ("8GB8", r"budget '8GB8' is not understood"),
        ("1e9B", r"budget '1e9B' is not understood"),
        ("0GB", r"budget '0GB' is less than one byte"),
        ("0.1B", r"budget '0.1B' is less than one byte"),
        (None, r"budget None of type NoneType is not understood"),
        ([8], r"budget \[8\] of type list is not understood"),
    ],
)
def test_rejections(budget, match):
    with pytest.raises(BudgetError, match=match):
        parse_budget(budget, reference_peak=1000)


@pytest.mark.parametrize("bad", ["8XB", 1.5, 0, None])
def test_rejections_list_accepted_forms(bad):
    with pytest.raises(BudgetError) as info:
        parse_budget(bad)
    message = str(info.value)
    assert "8GB" in message


def test_fraction_without_reference_peak_explains():
    with pytest.raises(BudgetError, match=r"budget 0\.5 is a fraction of the un-optimized peak, but no reference peak"):
        parse_budget(0.5)


@pytest.mark.parametrize("reference", [0, -1, 1.5, True, "1GB"])
def test_bad_reference_peak(reference):
    with pytest.raises(BudgetError, match=r"reference_peak .* must be a positive int"):
        parse_budget(0.5, reference_peak=reference)


def test_tiny_fraction_is_less_than_a_byte():
    with pytest.raises(BudgetError, match=r"less than one byte"):
        parse_budget(1e-6, reference_peak=1000)


def test_budget_error_is_a_value_error():
    with pytest.raises(ValueError):
        parse_budget("nope")


@pytest.mark.parametrize(
    "n, text",
    [
        (0, "0 B"),
        (800, "800 B"),
        (1023, "1023 B"),
        (1024, "1.0 KiB"),
        (1536, "1.5 KiB"),
        (512 * 2**20, "512.0 MiB"),
        (int(55.5 * 2**20), "55.5 MiB"),
        (int(1.5 * 2**30), "1.50 GiB"),
        (3 * 2**40, "3.00 TiB"),
        (-2048, "-2.0 KiB"),
    ],
)
def test_format_bytes(n, text):
    assert format_bytes(n) == text
