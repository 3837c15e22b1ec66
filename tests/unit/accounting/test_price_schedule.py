"""The price file: per model and a default, effective dates, LiteLLM's names, and every
kind of bad input refused whole with its reason."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from proxy.accounting.price_schedule import PriceFile, load_prices, one_line
from proxy.accounting.prices import PriceTable
from proxy.accounting.units import Quantities, Unit

EXAMPLE = """
currency: EUR
timezone: Europe/Paris
default:
  prompt_tokens: "0.0000002"
  completion_tokens: 0.0000008
models:
  qwen:
    - from: 2026-01-01
      input_cost_per_token: 1.5e-07
      output_cost_per_token: 6e-07
      cache_read_input_token_cost: 7.5e-08
    - from: 2026-11-15T12:00:00+01:00
      prompt_tokens: "0.00000012"
      completion_tokens: "0.0000005"
  whisper: {audio_seconds: "0.0001"}
"""
MID = datetime(2026, 11, 15, 11, tzinfo=UTC)  # the second qwen price starts here


def table_of(data: dict[str, Any]) -> PriceTable:
    return PriceFile.model_validate(data).table()


def test_the_example_prices_each_model_from_its_time(tmp_path: Path) -> None:
    """A date is local midnight; the price change applies from its instant; a model of its
    own never falls back to the default; others get the default."""
    path = tmp_path / "prices.yaml"
    path.write_text(EXAMPLE)
    table = load_prices(path)
    assert (table.currency, table.decimals) == ("EUR", 2)
    before = table.rate("qwen", datetime(2026, 11, 15, 10, 59, 59, 999999, tzinfo=UTC))
    after = table.rate("qwen", MID)
    assert before is not None
    assert after is not None
    assert before.price(Unit.PROMPT) == Decimal("1.5e-7")
    assert before.price(Unit.CACHED) == Decimal("7.5e-8")
    assert after.price(Unit.PROMPT) == Decimal("0.00000012")
    assert before.start == datetime(2025, 12, 31, 23, tzinfo=UTC)  # Paris midnight
    assert table.rate("qwen", datetime(2025, 12, 31, 22, tzinfo=UTC)) is None
    other = table.rate("bge", datetime(2020, 1, 1, tzinfo=UTC))
    assert other is not None
    assert other.price(Unit.COMPLETION) == Decimal("8e-7")
    assert table.cuts() == [before.start, MID]


def test_a_unit_without_a_price_leaves_the_record_unpriced() -> None:
    """Audio seconds on a model priced in tokens only: no amount (never a silent zero);
    a unit the record does not hold needs no price."""
    table = table_of({"currency": "USD", "default": {"prompt_tokens": "1"}})
    assert table.nanos("m", Quantities(audio_seconds=3), MID) is None
    assert table.nanos("m", Quantities(prompt_tokens=3), MID) == 3 * 10**9


BAD: list[tuple[dict[str, Any], str]] = [
    ({"currency": "USD", "default": {"image_tokens": "1"}}, "unknown unit 'image_tokens'"),
    ({"currency": "USD", "default": {"prompt_tokens": "-1"}}, "negative"),
    ({"currency": "USD", "default": {"prompt_tokens": "cheap"}}, "not a number"),
    ({"currency": "USD", "default": {"prompt_tokens": 0.1}}, "float"),
    (
        {"currency": "USD", "default": {"prompt_tokens": "1", "input_cost_per_token": "2"}},
        "given twice",
    ),
    ({"currency": "USD", "default": {"from": "2026-01-01"}}, "no price"),
    (
        {
            "currency": "USD",
            "models": {
                "m": [
                    {"from": "2026-01-01", "until": "2026-03-01", "prompt_tokens": "1"},
                    {"from": "2026-02-01", "prompt_tokens": "2"},
                ]
            },
        },
        "overlaps",
    ),
    (
        {
            "currency": "USD",
            "models": {"m": [{"prompt_tokens": "1"}, {"prompt_tokens": "2"}]},
        },
        "two prices start",
    ),
    (
        {
            "currency": "USD",
            "models": {
                "m": [
                    {"from": "2026-01-01", "prompt_tokens": "1"},
                    {"from": "2026-01-01T00:00:00+00:00", "prompt_tokens": "2"},
                ]
            },
        },
        "two prices start",
    ),
    (
        {
            "currency": "USD",
            "default": {"from": "2026-02-01", "until": "2026-01-01", "prompt_tokens": "1"},
        },
        "ends",
    ),
    ({"currency": "dollars", "default": {"prompt_tokens": "1"}}, "ISO 4217"),
    ({"currency": "USD", "timezone": "Mars/Olympus"}, "is not a time zone"),
    ({"currency": "USD", "default": {"from": "soon", "prompt_tokens": "1"}}, "ISO 8601"),
    ({"default": {"prompt_tokens": "1"}}, "currency"),
]


@pytest.mark.parametrize(("data", "why"), BAD)
def test_bad_input_is_refused_whole_in_one_line(data: dict[str, Any], why: str) -> None:
    """An unknown unit, a negative or non-numeric price, overlapping effective dates and
    the rest: refused, and said in one line naming the place."""
    with pytest.raises(ValidationError) as caught:
        PriceFile.model_validate(data)
    said = one_line(caught.value)
    assert why in said
    assert "\n" not in said


def test_a_gap_between_prices_prices_nothing() -> None:
    """A model whose price ends before the next begins has no price between them."""
    table = table_of(
        {
            "currency": "USD",
            "models": {
                "m": [
                    {"from": "2026-01-01", "until": "2026-02-01", "prompt_tokens": "1"},
                    {"from": "2026-03-01", "prompt_tokens": "2"},
                ]
            },
        }
    )
    assert table.rate("m", datetime(2026, 1, 31, tzinfo=UTC)) is not None
    assert table.rate("m", datetime(2026, 2, 15, tzinfo=UTC)) is None
    assert table.rate("m", datetime(2026, 3, 1, tzinfo=UTC)) is not None


def test_invoice_rounding_uses_the_currencys_minor_unit() -> None:
    """Yen have no minor unit; a file may say otherwise."""
    yen = table_of({"currency": "JPY", "default": {"prompt_tokens": "1"}})
    assert str(yen.due(Decimal("12.5"))) == "12"
    four = table_of({"currency": "USD", "decimals": 4, "default": {"prompt_tokens": "1"}})
    assert str(four.due(Decimal("0.00005"))) == "0.0000"


def test_every_problem_of_a_price_file_is_named_with_what_it_meant() -> None:
    """Issue #59 item 4: a file with the typo `prompt_token`, a negative price and a
    LiteLLM entry pasted whole named only its first problem, with no "did you mean". Each
    is named, in the file's words (no pydantic wording), the typo with its fix and the
    pasted entry once."""
    data = {
        "currency": "USD",
        "timezone": "Paris",
        "models": {
            "a": {"prompt_token": "0.1"},
            "b": {"prompt_tokens": "-0.1"},
            "c": {
                "input_cost_per_token": 1.5e-07,
                "output_cost_per_token": 6e-07,
                "max_tokens": 8192,
                "litellm_provider": "openai",
                "mode": "chat",
                "supports_vision": True,
            },
        },
    }
    with pytest.raises(ValidationError) as caught:
        PriceFile.model_validate(data)
    said = one_line(caught.value)
    assert "models.a.0: unknown unit 'prompt_token'" in said
    assert "did you mean 'prompt_tokens'?" in said
    assert "models.b.0.prompt_tokens: -0.1 is negative" in said
    assert "models.c.0: max_tokens, litellm_provider, mode, supports_vision are no prices" in said
    assert "timezone: 'Paris' is not a time zone" in said
    assert "did you mean 'Europe/Paris'?" in said
    assert "Value error" not in said
    assert "float" in said  # LiteLLM's floats are refused for what they are, not dropped


def test_a_name_given_twice_refuses_the_price_file(tmp_path: Path) -> None:
    """Issue #59 item 3: a model priced twice in one mapping kept the later silently. The
    file is refused, naming it and both lines."""
    from proxy.accounting.price_schedule import PriceFileError

    path = tmp_path / "prices.yaml"
    path.write_text(
        "currency: USD\nmodels:\n  a: {prompt_tokens: '1'}\n  a: {prompt_tokens: '2'}\n"
    )
    with pytest.raises(PriceFileError) as caught:
        load_prices(path)
    assert one_line(caught.value).startswith("'a' is given twice, at lines 3 and 4")


def test_a_name_given_twice_does_not_hide_the_price_files_other_problems(
    tmp_path: Path,
) -> None:
    """Issue #59 items 3 and 4 (one pass): a model priced twice stopped the reading, so a
    typo and a negative price elsewhere in the file were found one rerun at a time. The
    name given twice is said first, then every other problem, in one line."""
    path = tmp_path / "prices.yaml"
    path.write_text(
        "currency: USD\nmodels:\n  a: {prompt_token: '1'}\n  a: {prompt_tokens: '2'}\n"
        "  b: {prompt_tokens: '-1'}\n  a: {prompt_tokens: '3'}\n"
    )
    with pytest.raises(ValueError, match="given twice") as caught:
        load_prices(path)
    said = one_line(caught.value)
    assert said.startswith("'a' is given twice, at lines 3 and 4")
    assert "'a' is given twice, at lines 3 and 6" in said
    assert "models.b.0.prompt_tokens: -1 is negative" in said
