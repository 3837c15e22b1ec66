"""The family measurement's plan (scripts/families.py, issue #30): which releases each
family is measured on, and that its requests can tell the two tokenizer semantics apart."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.tokenizers.hf import load_tokenizer
from scripts.families import FAMILIES, WHITESPACE_DOCS, WHITESPACE_Q, families_on
from scripts.prepare_models import write_xlmr_tokenizer

XLMR = ["xlmr-cross-encoder", "xlmr-bi-encoder"]


@pytest.mark.parametrize(
    ("version", "measured"),
    [
        ("0.13.0", []),
        ("0.15.1", XLMR),
        ("0.16.0", XLMR),
        ("0.26.0", XLMR),
        ("0.27.0", list(FAMILIES)),
        ("0.32.0", list(FAMILIES)),
    ],
)
def test_the_xlmr_families_are_measured_from_0_15_and_the_others_from_0_27(
    version: str, measured: list[str]
) -> None:
    """The XLM-R models run from 0.15.1 (the last release on transformers 4.x); the
    families whose architectures 0.27 registered, from 0.27.0."""
    assert families_on(version) == measured


def test_the_whitespace_texts_count_differently_under_transformers_4_and_5(
    tmp_path: Path,
) -> None:
    """Every whitespace text but ``tab\\there`` (kept from the issue) has another count
    when the XLM-R tokenizer is loaded as 4.x loads it than as 5.x rebuilds it, so the
    family requests in front of a 4.x release fail if the proxy counts with 5.x."""
    write_xlmr_tokenizer(tmp_path)
    as_4 = load_tokenizer(tmp_path, transformers_4=True)
    as_5 = load_tokenizer(tmp_path)
    texts = [WHITESPACE_Q, *WHITESPACE_DOCS]
    differ = [
        text
        for text, four, five in zip(
            texts,
            as_4.lengths(texts, max_length=None),
            as_5.lengths(texts, max_length=None),
            strict=True,
        )
        if four != five
    ]
    assert differ == [t for t in texts if t != "tab\there"]
