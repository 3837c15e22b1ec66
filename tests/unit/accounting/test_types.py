"""The release table: what each vLLM release reports, cuts and pads."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from proxy.accounting.types import Release, Truncation


@pytest.mark.parametrize(
    ("version", "inflates", "iterative", "proven"),
    [
        ("0.8.5", True, False, True),
        ("0.9.2", True, False, False),
        ("0.10.2", True, False, True),
        ("0.15.1", True, False, True),
        ("0.16.0", True, False, True),
        ("0.17.1", True, False, False),
        ("0.19.1", True, False, True),
        ("0.20.2", True, False, True),
        ("0.26.2", True, False, True),
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
    iteratively; proven are the minor series make compat runs (docs/compatibility.md):
    a sample of 0.8-0.26, every release from 0.27."""
    release = Release(version)
    fixed = release.reports_engine_usage
    assert (None if fixed is None else not fixed) == inflates
    assert release.iterative_text_cut is iterative
    assert release.proven is proven


@pytest.mark.parametrize(
    ("version", "legacy"),
    [
        ("0.8.5", True),
        ("0.15.1", True),
        ("0.16.0", True),
        ("0.18.1", True),
        ("0.19.0+cpu", True),
        ("0.19.1", False),
        ("0.19", False),
        ("0.20.2", False),
        ("0.29.0", False),
        (None, False),
    ],
)
def test_transformers_4_up_to_0_19_0(version: str | None, legacy: bool) -> None:
    """Regression found by make compat: 0.16.0 runs transformers 4.57.6 (its wheel pins
    it below 5, as every wheel up to 0.19.0 does); counted with 5.x's XLM-R pipeline, 9 of
    35 bi-encoder requests were billed at the inflated report (156 where the engine
    processed 75). 0.19.1 first accepts 5.x."""
    assert Release(version).runs_transformers_4 is legacy


@pytest.mark.parametrize(("version", "pads"), [("0.28.0", False), ("0.29.0", True), (None, True)])
def test_padding_boundary_0_28_to_0_29(version: str | None, pads: bool) -> None:
    """Regression found by make compat: 0.28.0 ignores padding="max_length" (an unknown
    extra field then); the proxy counted the padding and billed the inflated figure."""
    release = Release(version)
    asked = Truncation(pad_to_max_length=True)
    assert release.pads is pads
    assert release.applied(asked).pad_to_max_length is pads
    assert release.applied(Truncation()) == Truncation()


@pytest.mark.parametrize(
    ("version", "cuts"), [("0.8.5", False), ("0.19.1", False), ("0.20.0", True), (None, True)]
)
def test_max_tokens_per_boundary_0_19_to_0_20(version: str | None, cuts: bool) -> None:
    """max_tokens_per_query/doc are request fields from 0.20 (absent from 0.19.1's
    protocol); earlier releases ignore them as extras and encode the whole text, so the
    proxy must not cut (make compat: max-per-doc on 0.15.1)."""
    release = Release(version)
    asked = Truncation(max_tokens_per_query=5, max_tokens_per_doc=10, truncate_prompt_tokens=7)
    applied = release.applied(asked)
    assert release.cuts_text is cuts
    assert (applied.max_tokens_per_query, applied.max_tokens_per_doc) == (
        (5, 10) if cuts else (0, 0)
    )
    assert applied.truncate_prompt_tokens == 7  # known to every release


def test_options_every_release_ignores_together() -> None:
    """0.8.5 ignores both padding and max_tokens_per_*; the rest of the request stays."""
    asked = Truncation(pad_to_max_length=True, max_tokens_per_doc=3, truncation_side="left")
    assert Release("0.8.5").applied(asked) == Truncation(truncation_side="left")
    assert Release("0.32.0").applied(asked) == asked


@pytest.mark.parametrize(
    ("version", "left", "right"),
    [("0.16.0", 12, 7), ("0.19.0", None, 7), ("0.19.1", None, 7), ("0.20.2", 12, 7), (None, 12, 7)],
)
def test_left_truncation_is_not_applied_on_0_19(
    version: str | None, left: int | None, right: int
) -> None:
    """Regression found by make compat on 0.19.1: truncate_prompt_tokens with
    truncation_side "left" is not applied by its scoring (197 processed, the proxy
    predicted 32 and billed the reported 208 as a mismatch); "right" cuts as everywhere."""
    release = Release(version)
    asked = Truncation(truncate_prompt_tokens=12, truncation_side="left")
    assert release.applied(asked).truncate_prompt_tokens == left
    right_cut = Truncation(truncate_prompt_tokens=7, truncation_side="right")
    assert release.applied(right_cut).truncate_prompt_tokens == right


SWITCHES = (
    "proven",
    "reports_engine_usage",
    "pads",
    "cuts_text",
    "truncates_left",
    "runs_transformers_4",
    "invocations_model_from_header",
    "only_second_needs_room",
    "reserves_score_tokens",
    "joins_cut_texts",
    "iterative_text_cut",
    "sanitizes_repeatedly",
)
COMPATIBILITY = Path(__file__).parents[3] / "docs" / "compatibility.md"
DOCUMENTED = sorted(set(re.findall(r"\b0\.\d+\.\d+\b", COMPATIBILITY.read_text())))


def _switches(release: Release) -> tuple[object, ...]:
    return tuple(getattr(release, name) for name in SWITCHES)


def test_every_documented_release_is_read() -> None:
    """The releases docs/compatibility.md names are all found (a guard for the table below)."""
    assert {"0.8.5", "0.19.1", "0.29.0", "0.32.0", "0.33.0"} <= set(DOCUMENTED)


@pytest.mark.parametrize("version", DOCUMENTED)
@pytest.mark.parametrize(
    "build", ["{}+cpu", "v{}", "{}rc1", "{}.dev12+gabc1234", "{}.post1", "{}+cu128.abi3", "{}-cpu"]
)
def test_builds_of_a_release_switch_as_the_release(version: str, build: str) -> None:
    """Every release in docs/compatibility.md, as vLLM's builds spell it (local CPU and CUDA
    builds, release candidates, dev builds, post releases, and a build that is not PEP 440
    at all), behaves as the plain release: each switch of the table is the same."""
    plain = Release(version)
    assert plain.proven is not None  # a release the table reads, not an unknown one
    assert _switches(Release(build.format(version))) == _switches(plain)


@pytest.mark.parametrize("odd", ["", "unknown", "0", "dev", "x0.30.0"])
def test_a_version_with_no_release_numbers_is_unknown(odd: str) -> None:
    """A version without ``X.Y`` is unknown: every switch takes the newest behaviour."""
    assert _switches(Release(odd)) == _switches(Release(None))


@pytest.mark.parametrize(("version", "repeated"), [("0.33.0", False), ("0.34.0", True)])
def test_jina_texts_are_sanitized_repeatedly_from_0_34(version: str, repeated: bool) -> None:
    """0.34.0's ``JinaRankingIOProcessorMixin`` strips the embed tokens until none is left
    (read in the wheel); 0.33.0 and earlier make one pass."""
    assert Release(version).sanitizes_repeatedly is repeated
