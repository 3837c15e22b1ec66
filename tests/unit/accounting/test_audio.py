"""Audio requests read from their form as vLLM reads them: model, streaming, the usage to
ask for, and the whole answers that carry none."""

from __future__ import annotations

import pytest

from proxy.accounting import audio
from proxy.accounting.audio import prepare_form
from proxy.accounting.types import Release
from proxy.wire.forms import read_form

KIND = "multipart/form-data; boundary=xyz"
NEW, OLD = Release("0.32.0"), Release("0.8.5")


def form(**fields: str) -> bytes:
    parts = [b'Content-Disposition: form-data; name="file"; filename="a.wav"\r\n\r\nRIFF']
    parts += [
        b'Content-Disposition: form-data; name="' + k.encode() + b'"\r\n\r\n' + v.encode()
        for k, v in fields.items()
    ]
    return b"".join(b"--xyz\r\n" + p + b"\r\n" for p in parts) + b"--xyz--\r\n"


@pytest.mark.parametrize(
    ("operation", "fields", "release", "unbillable"),
    [
        ("transcriptions", {}, NEW, None),
        ("transcriptions", {"response_format": "text"}, NEW, None),
        ("transcriptions", {"response_format": "diarized_json"}, NEW, None),
        ("transcriptions", {"response_format": "verbose_json"}, NEW, "transcriptions.verbose_json"),
        ("transcriptions", {}, OLD, "transcriptions.whole"),
        ("transcriptions", {"stream": "false"}, NEW, None),
        ("translations", {}, NEW, "translations.whole"),
        ("translations", {"stream": "0"}, NEW, "translations.whole"),
        ("translations", {"stream": "true", "response_format": "verbose_json"}, NEW, None),
        ("transcriptions", {"stream": "yes"}, OLD, None),
    ],
)
def test_what_a_whole_answer_cannot_be_billed_for(
    operation: str, fields: dict[str, str], release: Release, unbillable: str | None
) -> None:
    """A whole answer with no usage in vLLM's code names its --allow-unmetered feature;
    a stream (billed in tokens) never does."""
    assert prepare_form(operation, form(**fields), KIND, release).unbillable == unbillable


@pytest.mark.parametrize(
    ("fields", "appended"),
    [
        ({"stream": "true"}, [("stream_include_usage", "true")]),
        ({"stream": "1", "stream_include_usage": "false"}, [("stream_include_usage", "true")]),
        (
            {"stream": "on", "stream_continuous_usage_stats": "true"},
            [("stream_include_usage", "true"), ("stream_continuous_usage_stats", "false")],
        ),
        ({"stream": "true", "stream_include_usage": "t"}, []),
    ],
)
def test_a_stream_asks_for_its_usage_in_the_form(
    fields: dict[str, str], appended: list[tuple[str, str]]
) -> None:
    """The usage is asked for as the last part (the value vLLM reads), hidden from a
    client that did not ask; continuous usage a client asked for alone stays off (vLLM
    reads it only with include_usage); a client that asked keeps the form as sent."""
    raw = form(**fields)
    prepared = prepare_form("transcriptions", raw, KIND, NEW)
    assert prepared.streamed
    assert prepared.strip_usage is bool(appended)
    before = read_form(raw, KIND).items
    assert read_form(prepared.body, KIND).items == [*before, *appended]


@pytest.mark.parametrize(
    ("fields", "model"),
    [({"model": "whisper"}, "whisper"), ({"model": ""}, None), ({}, None)],
)
def test_the_model_is_the_forms(fields: dict[str, str], model: str | None) -> None:
    """The model field, an empty one meaning the default (FastAPI reads "" as absent)."""
    assert prepare_form("transcriptions", form(**fields), KIND, NEW).model == model


def test_a_body_that_is_not_a_form_is_sent_as_it_came() -> None:
    """JSON (vLLM refuses it: no file) is not read, not refused, not streamed."""
    prepared = prepare_form("transcriptions", b'{"stream": true}', "application/json", NEW)
    assert (prepared.body, prepared.streamed, prepared.refusal) == (
        b'{"stream": true}',
        False,
        None,
    )


def test_a_form_starlette_refuses_is_refused_with_its_message() -> None:
    """A part without a name: Starlette's message, param "body"."""
    raw = b"--xyz\r\nContent-Disposition: form-data\r\n\r\n1\r\n--xyz--\r\n"
    refusal = prepare_form("transcriptions", raw, KIND, NEW).refusal
    assert refusal is not None
    assert refusal.message.startswith("The Content-Disposition header field")
    assert refusal.param == "body"


@pytest.mark.parametrize(
    ("fields", "unbillable"),
    [
        ({"use_beam_search": "true", "n": "8"}, "transcriptions.beam_search"),
        ({"use_beam_search": "true"}, "transcriptions.beam_search"),
        ({"use_beam_search": "false", "n": "8"}, None),
        ({"use_beam_search": ""}, None),
    ],
)
def test_beam_search_is_work_the_seconds_do_not_show(
    fields: dict[str, str], unbillable: str | None
) -> None:
    """Beam search decodes n beams per chunk of audio, billed in the audio's seconds
    alone: refused unless --allow-unmetered names transcriptions.beam_search."""
    assert prepare_form("transcriptions", form(**fields), KIND, NEW).unbillable == unbillable


# --- forms whose appended stream_include_usage vLLM never reads ---


def test_a_close_delimiter_in_the_epilogue_does_not_hide_the_usage_request() -> None:
    """A form closed once, then a second closing delimiter in its epilogue: the part the
    proxy adds must still be one vLLM reads (the sent form asks for include_usage)."""
    raw = form(stream="true") + b"\r\n--xyz--\r\n"  # epilogue: ignored by every parser
    assert read_form(raw, KIND).value("stream") == "true"  # vLLM streams it
    prepared = prepare_form("transcriptions", raw, KIND, NEW)
    assert prepared.streamed
    assert prepared.strip_usage
    assert read_form(prepared.body, KIND).value("stream_include_usage") == "true"


def test_a_form_charset_does_not_hide_the_usage_request() -> None:
    """A form whose charset is EBCDIC (cp500), its names and values written in it: vLLM
    (Starlette) reads stream=true and model, and must read the appended include_usage."""
    kind = KIND + "; charset=cp500"

    def part(name: str, value: bytes, extra: bytes = b"") -> bytes:
        head = b'Content-Disposition: form-data; name="' + name.encode("cp500") + b'"' + extra
        return b"--xyz\r\n" + head + b"\r\n\r\n" + value + b"\r\n"

    raw = (
        part("file", b"RIFF", b'; filename="a.wav"')
        + part("stream", "true".encode("cp500"))
        + part("model", "whisper".encode("cp500"))
        + b"--xyz--\r\n"
    )
    as_read = read_form(raw, kind)
    assert (as_read.value("stream"), as_read.value("model")) == ("true", "whisper")
    prepared = prepare_form("transcriptions", raw, kind, NEW)
    assert prepared.streamed
    assert prepared.strip_usage
    assert read_form(prepared.body, kind).value("stream_include_usage") == "true"


def test_a_form_whose_usage_request_is_not_read_back_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The form to send is read again as vLLM reads it: should the added part not read
    back (a form trick no test foresaw, here a with_field that adds nothing), the stream
    is refused (400, nothing forwarded) rather than relayed without its usage."""
    monkeypatch.setattr(audio, "with_field", lambda body, *args: body)
    prepared = prepare_form("transcriptions", form(stream="true"), KIND, NEW)
    assert prepared.refusal is not None
    assert "cannot be metered as sent" in prepared.refusal.message
