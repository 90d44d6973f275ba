"""Numbers in text, normalised (`1,000` is 1000, `12 million` is 12e6), and whether a passage states one."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

_NUMBER = re.compile(
    r"""
    (?<![\w.,])
    (?P<mantissa>\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?)
    (?![.,]\d)
    (?:
        \s?(?P<word_scale>%|percent\b|per\s?cent\b|thousand\b|million\b|billion\b|trillion\b)
      | (?P<short_scale>k|m|bn|b)(?!\w)
    )?
    (?:st|nd|rd|th|s)?
    (?!\w)
    """,
    re.VERBOSE | re.IGNORECASE,
)
_SCALES: dict[str, Decimal] = {
    "thousand": Decimal(10) ** 3, "k": Decimal(10) ** 3,
    "million": Decimal(10) ** 6, "m": Decimal(10) ** 6,
    "billion": Decimal(10) ** 9, "bn": Decimal(10) ** 9, "b": Decimal(10) ** 9,
    "trillion": Decimal(10) ** 12,
}
_NUMBER_WORDS: dict[str, int] = {
    word: value for value, word in enumerate(
        "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen "
        "sixteen seventeen eighteen nineteen twenty".split()
    )
} | {"thirty": 30, "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90,
     "hundred": 100, "dozen": 12, "half": 50}
_NUMBER_WORD = re.compile(r"\b(" + "|".join(_NUMBER_WORDS) + r")\b", re.IGNORECASE)


@dataclass(frozen=True)
class Number:
    mantissa: Decimal
    multiplier: Decimal
    decimals: int

    @property
    def value(self) -> Decimal:
        return self.mantissa * self.multiplier


def numbers_in(text: str) -> list[Number]:
    """Numbers, dates, percentages and scaled quantities in `text`, normalised (`1,000` is 1000, `12 million` 12e6)."""
    found: list[Number] = []
    for match in _NUMBER.finditer(text):
        raw = match.group("mantissa").replace(",", "")
        try:
            mantissa = Decimal(raw)
        except InvalidOperation:
            continue
        scale = (match.group("word_scale") or match.group("short_scale") or "").lower()
        multiplier = _SCALES.get(scale, Decimal(1))
        decimals = len(raw.partition(".")[2])
        found.append(Number(mantissa, multiplier, decimals))
    return found


def passage_values(text: str) -> set[Decimal]:
    """Every value a passage states: scaled and unscaled forms, and small numbers written as words."""
    values: set[Decimal] = set()
    for number in numbers_in(text):
        values.update((number.value, number.mantissa))
    values.update(Decimal(_NUMBER_WORDS[word.lower()]) for word in _NUMBER_WORD.findall(text))
    return values


def number_is_stated(number: Number, values: Iterable[Decimal]) -> bool:
    """Whether a passage value equals `number`, allowing rounding to the precision the sentence wrote."""
    exponent = Decimal(1).scaleb(-number.decimals)
    for value in values:
        try:
            if (value / number.multiplier).quantize(exponent, rounding=ROUND_HALF_UP) == number.mantissa:
                return True
        except InvalidOperation:  # a value too large to round at this precision cannot be the one written
            continue
    return False


