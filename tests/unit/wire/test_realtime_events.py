"""A realtime session's usage, read from its events as they pass."""

from __future__ import annotations

import json

import pytest

from proxy.wire.realtime_events import MOST_SCREENED, SessionUsage, client_event


def done(prompt: object, completion: object) -> str:
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": 0}
    return json.dumps({"type": "transcription.done", "text": "hi", "usage": usage})


def test_the_done_usages_of_a_session_add_up() -> None:
    """Each utterance's transcription.done adds its tokens; deltas add nothing."""
    session = SessionUsage()
    session.from_server(json.dumps({"type": "transcription.delta", "delta": "transcription.done"}))
    session.from_server(done(10, 3))
    session.from_server(done(7, 2))
    assert (session.prompt, session.completion, session.done) == (17, 5, 2)
    assert session.why_unbilled is None


@pytest.mark.parametrize(
    "event",
    [
        done("10", 3),
        done(-1, 3),
        json.dumps({"type": "transcription.done", "text": "hi", "usage": None}),
        json.dumps({"type": "transcription.done", "text": "hi"}),
    ],
)
def test_a_done_without_a_readable_usage_makes_the_session_invalid(event: str) -> None:
    """vLLM's done always has a usage (UsageInfo); one without is named, not billed 0."""
    session = SessionUsage()
    session.from_server(done(10, 3))
    session.from_server(event)
    assert session.why_unbilled is not None
    assert "readable usage" in session.why_unbilled


def test_a_session_without_a_done_is_unbilled() -> None:
    """No transcription.done: the reason says the engine's work is not billed."""
    session = SessionUsage()
    session.from_server(json.dumps({"type": "session.created", "id": "s", "created": 1}))
    assert session.why_unbilled is not None
    assert "without a transcription.done" in session.why_unbilled


@pytest.mark.parametrize(
    ("messages", "model"),
    [
        ([{"type": "session.update", "model": "w"}], "w"),
        ([{"type": "session.update", "model": "w"}, {"type": "session.update"}], "w"),
        ([{"type": "input_audio_buffer.append", "audio": "session.update"}], None),
        ([{"type": "session.update", "model": 3}], None),
    ],
)
def test_the_model_is_the_last_session_update_names(
    messages: list[dict[str, object]], model: str | None
) -> None:
    """session.update names the model; other events, and a model that is no string, do not."""
    session = SessionUsage()
    for message in messages:
        session.from_client(client_event(json.dumps(message)))
    session.from_client(client_event("not json session.update"))
    assert session.model == model


def test_only_a_served_name_is_the_sessions_model() -> None:
    """vLLM refuses a session.update naming a model it does not serve and transcribes with
    the one it serves: such a name does not replace the served one."""
    session = SessionUsage(serves=lambda name: name == "served")
    session.from_client(client_event(json.dumps({"type": "session.update", "model": "served"})))
    session.from_client(client_event(json.dumps({"type": "session.update", "model": "cheap"})))
    assert session.model == "served"


COMMIT = {"type": "input_audio_buffer.commit"}
REFUSED = {"type": "error", "error": "x", "code": "model_not_validated"}


@pytest.mark.parametrize(
    ("client", "server", "state"),
    [
        ([], [], (False, False)),
        ([COMMIT], [], (True, False)),
        ([COMMIT, {**COMMIT, "final": True}], [], (True, True)),
        ([COMMIT, {**COMMIT, "final": "true"}], [], (True, True)),  # pydantic's lax bool
        ([COMMIT, {**COMMIT, "final": "maybe"}], [], (True, False)),  # vLLM refuses it
        ([COMMIT, {**COMMIT, "final": False}], [], (True, False)),
        ([{**COMMIT, "final": True}], [], (False, False)),  # no generation to end
        ([COMMIT, {**COMMIT, "final": True}], [done(1, 1)], (False, False)),
        ([COMMIT], [REFUSED], (False, False)),
        ([COMMIT], [{"type": "error", "error": "x", "code": "invalid_audio"}], (True, False)),
    ],
)
def test_whether_a_generation_may_be_running(
    client: list[dict[str, object]], server: list[object], state: tuple[bool, bool]
) -> None:
    """A commit starts a generation, a final commit ends its audio, its done (or vLLM's
    refusal of the commit) ends it: what the relay needs when the client leaves."""
    session = SessionUsage()
    for message in client:
        session.from_client(client_event(json.dumps(message)))
    for event in server:
        session.from_server(event if isinstance(event, str) else json.dumps(event))
    assert (session.running, session.final_sent) == state


def test_which_client_messages_start_a_generation() -> None:
    """A commit that is not final while none runs starts one (its utterance is admitted
    then); a final commit, a commit while one runs, an unreadable commit, or any other
    event does not."""
    session = SessionUsage()
    assert session.starts(client_event(json.dumps(COMMIT)))
    assert not session.starts(client_event(json.dumps({**COMMIT, "final": True})))
    assert not session.starts(client_event(json.dumps({**COMMIT, "final": "maybe"})))
    assert not session.starts(client_event(json.dumps({"type": "session.update", "model": "m"})))
    assert not session.starts(client_event('{"type": "input_audio_buffer.commit"'))
    session.from_client(client_event(json.dumps(COMMIT)))
    assert not session.starts(client_event(json.dumps(COMMIT)))


@pytest.mark.parametrize(
    ("text", "kind"),
    [
        ('{"type": "input_audio_buffer.\\u0063ommit"}', "input_audio_buffer.commit"),
        ('{"\\u0074ype": "session.update", "model": "m"}', "session.update"),
        ('{"type": "input_audio_buffer.commit", "x": NaN}', "input_audio_buffer.commit"),
        (json.dumps({**COMMIT, "pad": " " * MOST_SCREENED}), "input_audio_buffer.commit"),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * 100}), None),
        (json.dumps({"type": "input_audio_buffer.append", "audio": "A" * MOST_SCREENED}), None),
        ('{"type": "input_audio_buffer.commit"', None),
    ],
)
def test_a_client_event_is_read_as_vllm_reads_it(text: str, kind: str | None) -> None:
    """vLLM reads each message with json.loads whatever its size: an escaped name, NaN
    and padding past the screened size are the event they spell; an append or malformed
    JSON is none the session reads."""
    event = client_event(text)
    assert (event or {}).get("type") == kind
    assert kind is None or event.keys() == json.loads(text).keys()


def test_each_done_is_counted_with_its_usage() -> None:
    """``ended`` counts every done, ``last`` holds the last one's usage (None when it
    could not be read): what settles each utterance."""
    session = SessionUsage()
    session.from_server(done(3, 4))
    assert (session.ended, session.last) == (1, (3, 4))
    session.from_server(json.dumps({"type": "transcription.done", "text": ""}))
    assert (session.ended, session.last, session.done) == (2, None, 1)
