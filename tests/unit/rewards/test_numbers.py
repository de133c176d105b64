import pytest

from align.rewards.numbers import as_number, numbers_in


@pytest.mark.parametrize("text, expected", [
    ("1,000", ["1000"]),
    ("$1,000.00", ["1000"]),
    ("5.00", ["5"]),
    ("0.50", ["0.5"]),
    (".5 of it", ["0.5"]),
    ("it is 18.", ["18"]),
    ("x = -3", ["-3"]),
    ("-$5", ["-5"]),
    ("\u22127", ["-7"]),
    ("-0", ["0"]),
    ("10-3=7", ["10", "3", "7"]),
    ("5 - 3", ["5", "3"]),
    ("<<16-3-4=9>>9 eggs", ["16", "3", "4", "9", "9"]),
    ("3, 4 and 5", ["3", "4", "5"]),
    ("1,0000", []),  # not a thousands grouping: not read rather than read wrong
    ("3,4", []),
    ("50%", ["50"]),
    ("US$5", ["5"]),
    ("abc123", []),
    ("1234567.891", ["1234567.891"]),
    ("1e5", ["1"]),
    ("no digits", []),
])
def test_numbers_in(text, expected):
    assert numbers_in(text) == expected


@pytest.mark.parametrize("text, expected", [
    (" 114,200 ", "114200"), ("$18.", "18"), ("-5", "-5"), ("18 eggs", None), ("", None), ("1 2", None),
])
def test_as_number_reads_exactly_one_number(text, expected):
    assert as_number(text) == expected
