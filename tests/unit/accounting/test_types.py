"""The release table: what each vLLM release reports, cuts and pads."""

from __future__ import annotations

import pytest

from proxy.accounting.types import Release, Truncation


@pytest.mark.parametrize(
    ("version", "inflates", "iterative", "proven"),
    [
        ("0.26.2", True, False, False),
        ("0.27.0", True, False, True),
        ("0.29.0", True, False, True),
        ("0.29.9", True, False, True),
        ("0.30.0", False, False, True),
        ("0.30.1.dev12+gabc", False, False, True),
        ("0.31.0", False, True, True),
        ("0.32.0", False, True, True),
        ("0.33.0", False, True, False),
        (None, None, True, None),
    ],
)
def test_release_table_boundaries(
    version: str | None, inflates: bool | None, iterative: bool, proven: bool | None
) -> None:
    """0.29 -> 0.30: usage becomes engine-level; 0.30 -> 0.31: max_tokens_per_* cuts text
    iteratively; the proven range is what make compat runs (docs/compatibility.md)."""
    release = Release(version)
    fixed = release.reports_engine_usage
    assert (None if fixed is None else not fixed) == inflates
    assert release.iterative_text_cut is iterative
    assert release.proven is proven


@pytest.mark.parametrize(("version", "pads"), [("0.28.0", False), ("0.29.0", True), (None, True)])
def test_padding_boundary_0_28_to_0_29(version: str | None, pads: bool) -> None:
    """Regression found by make compat: 0.28.0 ignores padding="max_length" (an unknown
    extra field then); the proxy counted the padding and billed the inflated figure."""
    release = Release(version)
    asked = Truncation(pad_to_max_length=True)
    assert release.pads is pads
    assert release.applied(asked).pad_to_max_length is pads
    assert release.applied(Truncation()) == Truncation()
