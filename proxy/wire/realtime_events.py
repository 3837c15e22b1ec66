"""The realtime transcription WebSocket's events (vLLM 0.20.2 to 0.32.0,
``speech_to_text/realtime``): what a session bills, read from the messages as they pass.

Pure: text messages in, a running total out. The server ends each utterance with
``{"type": "transcription.done", "text": ..., "usage": {prompt_tokens, completion_tokens,
total_tokens}}``; a session may transcribe several, so the session's bill is their sum.

A generation starts at the client's ``input_audio_buffer.commit`` and streams
``transcription.delta`` events while audio arrives; only ``{"type":
"input_audio_buffer.commit", "final": true}`` ends its audio, and only then does vLLM send
its ``transcription.done``. A client that leaves before has it cancelled, unbilled: so the
session says whether a generation may be running (``running``) and whether its final
commit was sent, for the relay to end it as the client would have (``FINAL_COMMIT``).

The client names the model in ``session.update``; vLLM refuses a name it does not serve
and transcribes with the model it serves whatever the name, so only a served name counts.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, ValidationError

from proxy.wire.jsonio import loads
from proxy.wire.usage import token_count

DONE = "transcription.done"
COMMIT = "input_audio_buffer.commit"
# What ends a generation's audio (vLLM then sends its transcription.done).
FINAL_COMMIT = '{"type": "input_audio_buffer.commit", "final": true}'
# vLLM's answer to a commit before a served model was named: no generation started.
_NOT_VALIDATED = "model_not_validated"
# Audio appends are the bulk of a session (base64 PCM): a message up to this size is parsed
# only when it may be an event the session reads; a larger one always (off the event loop).
MOST_SCREENED = 64 * 1024
# What a message the session reads holds as sent, unless spelt with an escape.
_READ = (COMMIT, "session.update", "\\u")
Event = dict[str, object]


class _Commit(BaseModel):
    """vLLM's ``InputAudioBufferCommit`` (pydantic's lax bool, as vLLM reads it)."""

    model_config = ConfigDict(extra="ignore")
    final: bool = False


@dataclass(slots=True)
class SessionUsage:
    """The usage of one realtime session so far, and why it cannot be billed if not."""

    prompt: int = 0
    completion: int = 0
    done: int = 0  # transcription.done events with a usage
    ended: int = 0  # transcription.done events, with a usage or not
    model: str | None = None
    problem: str | None = None
    # Whether a model name is one the upstream serves (session.update's other names are
    # refused by vLLM and transcribe nothing).
    serves: Callable[[str], bool] = lambda _name: True
    running: bool = False  # a commit since the last transcription.done: a generation may run
    final_sent: bool = False  # ... and its final commit was sent
    last: tuple[int, int] | None = None  # the last transcription.done's prompt and completion

    def from_server(self, text: str) -> None:
        """A message vLLM sent: a ``transcription.done`` adds its usage (and ends the
        generation); an error refusing a commit means none started."""
        if DONE not in text and _NOT_VALIDATED not in text:
            return
        event = _event(text)
        if event is None:
            return
        if event.get("type") == "error" and event.get("code") == _NOT_VALIDATED:
            self.running = self.final_sent = False
            return
        if event.get("type") != DONE:
            return
        self.running = self.final_sent = False
        self.ended += 1
        self.last = None
        usage = event.get("usage")
        counts = (
            (token_count(usage.get("prompt_tokens")), token_count(usage.get("completion_tokens")))
            if isinstance(usage, dict)
            else (None, None)
        )
        if counts[0] is None or counts[1] is None:
            self.problem = f"a {DONE} event without a readable usage"
            return
        self.prompt += counts[0]
        self.completion += counts[1]
        self.last = (counts[0], counts[1])
        self.done += 1

    def from_client(self, event: Event | None) -> None:
        """A message the client sent (``client_event``): ``session.update`` names the
        model (when served); a commit starts a generation, a final one ends its audio."""
        if event is None:
            return
        kind = event.get("type")
        if kind == "session.update":
            model = event.get("model")
            self.model = model if isinstance(model, str) and self.serves(model) else self.model
        elif kind == COMMIT:
            try:  # read as vLLM reads it (an unreadable commit does nothing there)
                final = _Commit.model_validate(event).final
            except ValidationError:
                return
            if final:
                self.final_sent = self.running
            else:  # a commit while a generation runs is ignored by vLLM
                self.running = True

    def starts(self, event: Event | None) -> bool:
        """Whether a message the client sends (``client_event``) starts a generation: a
        commit (not final, read as vLLM reads it) while none runs."""
        if self.running or event is None or event.get("type") != COMMIT:
            return False
        try:
            return not _Commit.model_validate(event).final
        except ValidationError:
            return False

    @property
    def why_unbilled(self) -> str | None:
        """Why the session is recorded invalid (None: its usage is known)."""
        if self.problem is not None:
            return self.problem
        if not self.done:
            return f"the session ended without a {DONE} usage: its engine work is not billed"
        return None


def client_event(text: str) -> Event | None:
    """A client's message as vLLM reads it (``json.loads``: escapes decoded, any size)
    when it is an event the session reads (a commit or a ``session.update``); None for
    any other. A message over ``MOST_SCREENED`` is parsed whole: run it off the loop."""
    if len(text) <= MOST_SCREENED and not any(mark in text for mark in _READ):
        return None
    event = _event(text)
    if event is None or event.get("type") not in (COMMIT, "session.update"):
        return None
    return event


def _event(text: str) -> Event | None:
    try:
        event = loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
