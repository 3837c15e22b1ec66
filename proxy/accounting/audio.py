"""What an audio request is (``/v1/audio/transcriptions`` and ``/translations``), read
from its multipart form the way vLLM reads it, and the form to send.

Pure: bytes in, a decision out. vLLM's ``TranscriptionRequest`` and ``TranslationRequest``
are pydantic models filled from the form (FastAPI ``Form()``): each field's last value,
an empty one as absent, booleans in lax mode. What vLLM reports (0.10.2 to 0.32.0,
``speech_to_text``): a whole transcription carries ``usage: {"type": "duration",
"seconds": N}`` (not in ``verbose_json``, nor before 0.10); a whole translation no usage
at all; a stream, token usage in a last chunk when the form asks
``stream_include_usage``. So the proxy asks for it, as it asks for ``include_usage`` in
chat, and hides that chunk from a client that did not.
"""

from __future__ import annotations

from proxy.accounting.dispatch import Prepared, Refusal, lax_bool, unbillable_feature
from proxy.accounting.operations import Operation
from proxy.accounting.types import Release
from proxy.wire.forms import File, Form, FormError, is_multipart, read_form, with_field

# The first series whose whole transcriptions carry the duration usage (read in 0.10.2;
# 0.8.5's TranscriptionResponse is text alone).
DURATION_FROM = (0, 10)
# The form field each audio feature's refusal names (vLLM's ``param``).
FEATURE_FIELDS = {
    "transcriptions.whole": "stream",
    "transcriptions.verbose_json": "response_format",
    "translations.whole": "stream",
    "transcriptions.beam_search": "use_beam_search",
    "translations.beam_search": "use_beam_search",
}


def prepare_form(
    operation: Operation, body: bytes, content_type: str | None, release: Release
) -> Prepared:
    """Read one audio request: its model, whether it streams, what it cannot be billed
    for; a stream that did not ask for its usage asks for it in the form sent (one part
    appended, the rest as sent) and has that chunk hidden. A body that is not a form is
    sent as it came (vLLM answers it 422: no file); a form Starlette refuses is refused
    here with its message, as vLLM would (400)."""
    if not is_multipart(content_type):
        return Prepared(body, operation, None)
    assert content_type is not None
    try:
        form = read_form(body, content_type)
    except FormError as exc:
        return Prepared(body, operation, None, refusal=Refusal(str(exc), "body"))
    model = _text(form.value("model"))
    last = dict(form.items)  # each field's last value, the one vLLM reads
    sent_fields = {n: v for n, v in last.items() if isinstance(v, str) and v}
    multiplying = unbillable_feature(operation, sent_fields, True)
    if multiplying is not None:  # beam search: never streamed, billed in seconds alone
        return Prepared(body, operation, model, unbillable=multiplying)
    if not _flag(form.value("stream")):
        feature = _whole_feature(operation, form.value("response_format"), release)
        return Prepared(body, operation, model, unbillable=feature)
    if _flag(form.value("stream_include_usage")):
        return Prepared(body, operation, model, streamed=True)
    continuous = _flag(form.value("stream_continuous_usage_stats"))
    try:
        sent = with_field(body, form.boundary, "stream_include_usage", "true", form.charset)
        if continuous:
            # vLLM reads it only with stream_include_usage: the client saw no usage per chunk
            sent = with_field(
                sent, form.boundary, "stream_continuous_usage_stats", "false", form.charset
            )
        proof = read_form(sent, content_type)  # the form as vLLM will read it
    except FormError as exc:  # no closing delimiter: nothing to append a part to
        return Prepared(body, operation, model, refusal=Refusal(str(exc), "body"))
    if not _asks_usage(proof, form, continuous):
        return Prepared(body, operation, model, refusal=Refusal(UNPROVEN_FORM, "body"))
    return Prepared(sent, operation, model, streamed=True, strip_usage=True)


UNPROVEN_FORM = (
    "This form cannot be metered as sent: the usage request the proxy adds to a stream "
    "would not be read from it. Send stream_include_usage=true in the form yourself."
)


def _asks_usage(proof: Form, form: Form, continuous: bool) -> bool:
    """Whether the form to send reads as the client's, plus the usage request: every
    field the client sent the same, ``stream_include_usage`` true, and the per-chunk
    usage off where the client had asked for it."""
    added = {"stream_include_usage", "stream_continuous_usage_stats"}
    same = [(n, v) for n, v in proof.items if n not in added] == [
        (n, v) for n, v in form.items if n not in added
    ]
    wanted = _flag(proof.value("stream_include_usage"))
    quiet = not continuous or not _flag(proof.value("stream_continuous_usage_stats"))
    return same and wanted and quiet


def _whole_feature(
    operation: Operation, response_format: str | File | None, release: Release
) -> str | None:
    """The feature of a whole (not streamed) answer that carries no usage."""
    if operation == Operation.TRANSLATIONS:
        return "translations.whole"
    if not release.since(DURATION_FROM):
        return "transcriptions.whole"
    if response_format == "verbose_json":
        return "transcriptions.verbose_json"
    return None


def _flag(value: str | File | None) -> bool:
    """A boolean form field as vLLM reads it: absent or empty is false."""
    return isinstance(value, str) and value != "" and lax_bool(value)


def _text(value: str | File | None) -> str | None:
    """A string form field as vLLM reads it: absent or empty is the default (None)."""
    return value if isinstance(value, str) and value else None
