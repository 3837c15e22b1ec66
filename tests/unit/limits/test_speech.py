"""What an audio request reserves before forwarding: a bound from its file's duration,
in tokens, and the units its record bills (seconds whole, tokens streamed)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from proxy.accounting.dispatch import Prepared
from proxy.accounting.types import ServedModel
from proxy.accounting.units import Quantities
from proxy.limits.limiter import Cost
from proxy.limits.speech import AUDIO_TOKENS_PER_SECOND, UNREADABLE, bound, price_speech
from tests.support.fakevllm.audio import AUDIO_PROMPT, CLIP_SECONDS, audio_tokens, wav

WHISPER = ServedModel("whisper", "whisper", 448, None, None)


def form(data: bytes) -> tuple[bytes, str]:
    """A multipart form holding ``data`` as its file, and its content type."""
    head = b'--b\r\nContent-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\n'
    model = b'\r\n--b\r\nContent-Disposition: form-data; name="model"\r\n\r\nwhisper'
    return head + data + model + b"\r\n--b--\r\n", "multipart/form-data; boundary=b"


def test_a_whole_transcription_bills_its_seconds_rounded_up() -> None:
    """2.5 s: three seconds billed (vLLM's usage), a token bound reserved."""
    body, kind = form(wav(2.5))
    found = price_speech(Prepared(body, "transcriptions", "whisper"), kind, WHISPER)
    assert found.refusal is None
    assert found.bills == Quantities(audio_seconds=3)
    assert found.price.cost == Cost(250 + 448, 448)


def test_a_stream_bills_tokens() -> None:
    """A stream's record bills the tokens its usage reports: those reserved."""
    body, kind = form(wav(2.5))
    prepared = Prepared(body, "transcriptions", "whisper", streamed=True)
    found = price_speech(prepared, kind, WHISPER)
    assert found.bills == Quantities(prompt_tokens=698, completion_tokens=448)


def test_what_cannot_be_read_is_refused_and_what_vllm_refuses_reserves_nothing() -> None:
    """A file libsndfile cannot read: refused; no form or no file: vLLM refuses it
    without engine work, the request alone is reserved."""
    body, kind = form(b"\0" * 512)
    found = price_speech(Prepared(body, "transcriptions", None), kind, WHISPER)
    assert found.refusal == UNREADABLE
    no_form = price_speech(Prepared(b"{}", "transcriptions", None), "application/json", WHISPER)
    assert (no_form.refusal, no_form.price.cost, no_form.bills) == (None, Cost(), Quantities())


def test_a_model_of_unknown_context_is_refused() -> None:
    """A served model whose context the upstream did not report has no bound per clip:
    refused under a budget (it was reserved at one token and its transcription served)."""
    body, kind = form(wav(2.5))
    unknown = ServedModel("whisper", "whisper", 0, None, None)
    found = price_speech(Prepared(body, "transcriptions", "whisper"), kind, unknown)
    assert found.refusal is not None
    assert "max_model_len" in found.refusal


@given(st.floats(0, 7200, allow_nan=False), st.booleans())
def test_the_bound_covers_what_the_fake_engine_reports(duration: float, streamed: bool) -> None:
    """Whatever the duration, the reservation holds what the record bills on the fake
    (vLLM's Whisper): its stream's prompt (the decoder prompt and 100 tokens a second)
    and every 30 s clip's text within the context; its whole seconds."""
    found = bound(duration, 448, streamed=streamed)
    clips = max(1, math.ceil(duration / CLIP_SECONDS))
    assert found.price.cost.prompt >= AUDIO_PROMPT + audio_tokens(duration)
    assert found.price.cost.completion >= clips * (448 - AUDIO_PROMPT)
    if streamed:
        assert found.bills.prompt_tokens == found.price.cost.prompt
    else:
        assert found.bills == Quantities(audio_seconds=math.ceil(duration))
    assert AUDIO_TOKENS_PER_SECOND >= 100


@pytest.mark.parametrize("duration", [29.0, 30.0, 59.0, 61.0])
def test_every_clip_vllm_splits_is_counted(duration: float) -> None:
    """vLLM's clips are at least 29 s but the last: never more than the bound counts."""
    found = bound(duration, 448, streamed=True)
    most_clips = math.floor(duration / 29) + 1 if duration > 30 else 1
    assert found.price.cost.completion >= most_clips * 448


@pytest.mark.parametrize(
    ("values", "per_clip"),
    [
        ([b"3"], 3),
        ([b"9999"], 448),  # vLLM takes the least of it and the context
        ([b"1000", b"5"], 5),  # the last value is the one read
        ([b""], 448),  # an empty value is absent
        ([b"three"], 448),  # not an int: vLLM refuses it
        ([b"0"], 448),
    ],
)
def test_a_completion_cap_bounds_each_clip(values: list[bytes], per_clip: int) -> None:
    """max_completion_tokens, read as vLLM's form model reads it, caps each clip's
    completion (65 s: three clips); anything else leaves the context as the bound."""
    body, kind = form(wav(65))
    fields = b"".join(
        b'--b\r\nContent-Disposition: form-data; name="max_completion_tokens"\r\n\r\n'
        + value
        + b"\r\n"
        for value in values
    )
    prepared = Prepared(fields + body, "transcriptions", "whisper", streamed=True)
    found = price_speech(prepared, kind, WHISPER)
    assert found.price.cost.completion == 3 * per_clip
