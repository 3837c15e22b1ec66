"""What a speech-to-text request (``/v1/audio/transcriptions``, ``/translations``) may
cost before it is forwarded: a bound from its audio's duration, read from the file it
uploads (``wire.audiofile``), and the units its record will bill (docs/metering.md,
"Prices before forwarding").

vLLM splits audio longer than a clip (Whisper: 30 s, each split found in the last second
of a clip, so every clip but the last is at least 29 s) and runs one engine request per
clip, each within the model's context, after a one-token language detection when the form
names no language. A whole transcription's record bills the audio's seconds, rounded up
(vLLM's ``usage.seconds``); a stream's, the tokens its usage reports: the last clip's
decoder prompt plus one token per log-mel frame (Whisper: 100 a second; Voxtral and
Qwen3-ASR report fewer), and every clip's text. So the reservation is:

- tokens: prompt ``ceil(seconds * AUDIO_TOKENS_PER_SECOND)`` + the context, completion
  the context per clip (at most one context of margin per clip over the engine's work);
- money: the audio's seconds (whole) or those tokens (streamed), at the prices in force.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import TypeAdapter, ValidationError

from proxy.accounting.dispatch import Prepared
from proxy.accounting.types import ServedModel
from proxy.accounting.units import Quantities
from proxy.limits.limiter import Cost
from proxy.limits.pricing import NO_CONTEXT, UNPRICED, Price
from proxy.wire.audiofile import seconds
from proxy.wire.forms import File, FormError, is_multipart, read_form

# Prompt tokens a stream's usage reports per second of audio: Whisper's log-mel frames
# (16 kHz, hop 160), the most of the speech models vLLM serves.
AUDIO_TOKENS_PER_SECOND = 100
# The least audio a clip holds before the last (Whisper's 30 s, less the 1 s overlap vLLM
# searches for a quiet split point in).
CLIP_SECONDS = 29
_INT: TypeAdapter[int] = TypeAdapter(int)
UNREADABLE = (
    "The audio's duration cannot be read from the uploaded file (WAV, FLAC, OGG and MP3 "
    "can be read), so this request cannot be priced under its tenant's budget."
)


@dataclass(frozen=True, slots=True)
class SpeechPrice:
    """An audio request's reservation and the units its record bills at most (its money),
    or why it cannot be priced (refused, 400)."""

    price: Price
    bills: Quantities
    refusal: str | None = None


def price_speech(
    prepared: Prepared, content_type: str | None, model: ServedModel | None
) -> SpeechPrice:
    """Price one audio request (runs in a worker thread: the form is read again, its
    file's header decoded). A body that is no form, or a form without a file, makes no
    engine work (vLLM refuses it): nothing but the request is reserved."""
    nothing = SpeechPrice(Price(Cost(), "no audio: refused by vLLM"), Quantities())
    if not is_multipart(content_type):
        return nothing
    assert content_type is not None
    try:
        form = read_form(prepared.body, content_type, keep="file")
    except FormError:
        return nothing
    audio = form.kept
    if audio is None:
        return nothing
    if model is None:
        return SpeechPrice(Price(UNPRICED, "unpriced: unknown model"), Quantities(1, 1))
    if model.max_model_len <= 0:
        return SpeechPrice(Price(UNPRICED, NO_CONTEXT), Quantities(), NO_CONTEXT)
    duration = seconds(audio)
    if duration is None:
        return SpeechPrice(Price(UNPRICED, "unreadable audio"), Quantities(), UNREADABLE)
    cap = _cap(form.value("max_completion_tokens"))
    return bound(duration, model.max_model_len, streamed=prepared.streamed, cap=cap)


def bound(duration: float, context: int, *, streamed: bool, cap: int | None = None) -> SpeechPrice:
    """The reservation of ``duration`` seconds of audio on a model of ``context`` tokens,
    each clip's generation capped at ``cap`` (the form's ``max_completion_tokens``) when
    less, and what its record bills: tokens when ``streamed``, else whole seconds."""
    clips = max(1, math.ceil(duration / CLIP_SECONDS))
    per_clip = min(context, cap) if cap is not None and cap > 0 else context
    cost = Cost(math.ceil(duration * AUDIO_TOKENS_PER_SECOND) + context, clips * per_clip)
    price = Price(cost, f"bound: {duration:.3f} s of audio in {clips} clips")
    if streamed:
        return SpeechPrice(price, Quantities(cost.prompt, cost.completion))
    return SpeechPrice(price, Quantities(audio_seconds=math.ceil(duration)))


def _cap(value: str | File | None) -> int | None:
    """``max_completion_tokens`` as vLLM's form model reads it (an empty value is absent,
    pydantic's lax int); None when absent or not an int (vLLM refuses that: nothing runs,
    and the context stays the bound)."""
    if not isinstance(value, str) or value == "":
        return None
    try:
        return _INT.validate_python(value)
    except ValidationError:
        return None
