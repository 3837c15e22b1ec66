"""The realtime transcription WebSocket's events (vLLM 0.20.2 to 0.32.0,
``speech_to_text/realtime``): what a session bills, read from the messages as they pass.

Pure: text messages in, a running total out. The server ends each utterance with
``{"type": "transcription.done", "text": ..., "usage": {prompt_tokens, completion_tokens,
total_tokens}}``; a session may transcribe several, so the session's bill is their sum.
The client names the model in ``session.update``.
"""

from __future__ import annotations

from dataclasses import dataclass

from proxy.wire.jsonio import loads
from proxy.wire.usage import token_count

DONE = "transcription.done"
# Audio appends are the bulk of a session (base64 PCM); only smaller events are parsed.
_MOST_PARSED = 64 * 1024


@dataclass(slots=True)
class SessionUsage:
    """The usage of one realtime session so far, and why it cannot be billed if not."""

    prompt: int = 0
    completion: int = 0
    done: int = 0  # transcription.done events with a usage
    model: str | None = None
    problem: str | None = None

    def from_server(self, text: str) -> None:
        """A message vLLM sent: a ``transcription.done`` adds its usage."""
        if DONE not in text:
            return
        event = _event(text)
        if event is None or event.get("type") != DONE:
            return
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
        self.done += 1

    def from_client(self, text: str) -> None:
        """A message the client sent: ``session.update`` names the model."""
        if len(text) > _MOST_PARSED or "session.update" not in text:
            return
        event = _event(text)
        if event is not None and event.get("type") == "session.update":
            model = event.get("model")
            self.model = model if isinstance(model, str) else self.model

    @property
    def why_unbilled(self) -> str | None:
        """Why the session is recorded invalid (None: its usage is known)."""
        if self.problem is not None:
            return self.problem
        if not self.done:
            return f"the session ended without a {DONE} usage: its engine work is not billed"
        return None


def _event(text: str) -> dict[str, object] | None:
    try:
        event = loads(text)
    except ValueError:
        return None
    return event if isinstance(event, dict) else None
