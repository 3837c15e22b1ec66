"""Closed-loop proof of the ledger: compare the engine's own token counters with what this
proxy recorded, window by window. Pure: parsing, tallies and the settled window.

A window runs between two readings of the upstream's ``vllm:prompt_tokens_total`` (and
``vllm:generation_tokens_total``) taken while no metered exchange was in flight, so every
token the engine counted in it belongs to an exchange that finished inside it. Settled
means exact: zero drift is zero.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, field_validator

from proxy.accounting.operations import CHOICES_OPERATIONS, FORM_OPERATIONS
from proxy.ledger.records import UsageRecord, new_record_id

PROMPT_COUNTER = "vllm:prompt_tokens_total"
GENERATION_COUNTER = "vllm:generation_tokens_total"
START_TIME = "process_start_time_seconds"
UNPROVEN = frozenset({"mismatch", "unaudited", "invalid"})
_READ = (PROMPT_COUNTER, GENERATION_COUNTER, START_TIME)


@dataclass(frozen=True, slots=True)
class EngineReading:
    """The upstream's counters at one moment (summed over every label set)."""

    prompt: int
    generation: int
    started: float | None  # the engine process's start time: a change means a restart


def parse_engine_counters(text: str) -> EngineReading:
    """Read the counters from Prometheus text exposition; raises ValueError without them.

    A fast reading of the three samples it needs, held to ``prometheus_client.parser`` by
    a property test (tests/unit/ledger/test_windows.py)."""
    totals = {PROMPT_COUNTER: 0.0, GENERATION_COUNTER: 0.0}
    seen = set()
    started = None
    for line in text.splitlines():
        line = line.lstrip()
        if not line.startswith(_READ):  # most lines: histograms the window does not need
            continue
        name, value = _sample(line)
        if name in totals:
            totals[name] += float(value)
            seen.add(name)
        elif name == START_TIME:
            started = float(value)
    if PROMPT_COUNTER not in seen:
        raise ValueError(f"no {PROMPT_COUNTER} in the upstream's metrics")
    return EngineReading(round(totals[PROMPT_COUNTER]), round(totals[GENERATION_COUNTER]), started)


def _sample(line: str) -> tuple[str, str]:
    """A sample line's name and value (a timestamp may follow the value); ("", "") for a
    comment or a blank line. A label value may hold braces: the labels end at the last."""
    line = line.strip()
    if not line or line[0] == "#":
        return "", ""
    name, brace, labels = line.partition("{")
    if brace:
        fields = labels[labels.rindex("}") + 1 :].split()
    else:
        name, *fields = line.split()
    return name.strip(), fields[0] if fields else ""


@dataclass(slots=True)
class Tally:
    """What this proxy recorded (journaled) and saw fail since the window opened."""

    records: int = 0
    prompt_reported: int = 0
    prompt_billed: int = 0
    # What the engine's prompt counter grows by for these records: the billed prompt once
    # per choice (``n`` choices each read the prompt; the usage reports it once).
    prompt_expected: int = 0
    completion_reported: int = 0
    completion_billed: int = 0
    unproven: int = 0
    aborted: int = 0
    upstream_errors: int = 0
    refused: int = 0  # answered by the proxy itself, never forwarded: no engine work
    # Records billed in seconds of audio: the engine counts their tokens, no token bill does.
    in_seconds: int = 0
    # Streamed transcriptions and translations: their usage counts the audio as prompt
    # tokens, which the engine's prompt counter never sees (``causes``).
    audio_streams: int = 0
    verdicts: dict[str, int] = field(default_factory=dict)

    def merge(self, other: Tally) -> None:
        """Carry another tally (an attempt to close the window that was abandoned)."""
        for name in (
            *("records", "prompt_reported", "prompt_billed", "prompt_expected"),
            *("completion_reported", "completion_billed", "unproven", "aborted"),
            *("upstream_errors", "refused"),
            *("in_seconds", "audio_streams"),
        ):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for verdict, count in other.verdicts.items():
            self.verdicts[verdict] = self.verdicts.get(verdict, 0) + count

    def traffic(self, upstream_errors: int, refused: int) -> None:
        """What the traffic counted in the window beside the records: requests that failed
        upstream, and requests the proxy answered itself (no engine work)."""
        self.upstream_errors, self.refused = upstream_errors, refused

    def add(self, record: UsageRecord) -> None:
        self.records += 1
        self.prompt_reported += record.prompt_tokens_reported or 0
        self.prompt_billed += record.prompt_tokens_billed or 0
        copies = record.n if record.operation in CHOICES_OPERATIONS and record.n else 1
        self.prompt_expected += (record.prompt_tokens_billed or 0) * copies
        self.completion_reported += record.completion_tokens_reported or 0
        self.completion_billed += record.completion_tokens_billed or 0
        verdict = record.verdict or "none"
        self.verdicts[verdict] = self.verdicts.get(verdict, 0) + 1
        self.unproven += verdict in UNPROVEN
        self.aborted += record.aborted
        self.in_seconds += record.units.audio_seconds is not None
        audio = record.operation in FORM_OPERATIONS
        self.audio_streams += audio and record.units.prompt_tokens is not None


# A window's own shape: 5 since each cause is an object (``code``, ``message``); a window
# of 4 or less held each as a sentence (``"code: message"``), read back as objects.
WINDOW_SCHEMA_VERSION = 5


class CauseCode(enum.StrEnum):
    """What can explain a window's drift: a stable code for programs (docs/metering.md,
    "Reconciliation", lists them)."""

    COUNTER_RESET = "counter_reset"
    UPSTREAM_ERRORS = "upstream_errors"
    BILLED_IN_SECONDS = "billed_in_seconds"
    AUDIO_TOKENS = "audio_tokens"
    UNMETERED_TRAFFIC = "unmetered_traffic"
    UNPROVEN_RECORDS = "unproven_records"
    OVERBILLED = "overbilled"
    SHARED_UPSTREAM = "shared_upstream"


class Cause(BaseModel):
    """One cause of a window: its code, and the sentence for a person."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    code: CauseCode
    message: str

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class SettledWindow(BaseModel):
    """One reconciliation window: the engine's growth against this proxy's records."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: str = "reconciliation"
    schema_version: int = WINDOW_SCHEMA_VERSION
    window_id: str
    instance: str
    upstream: str
    start: datetime
    end: datetime
    status: str  # settled | counter_reset | shared
    records: int
    engine_prompt_tokens: int | None
    reported_prompt_tokens: int
    billed_prompt_tokens: int
    unbilled_prompt_tokens: int
    overbilled_prompt_tokens: int
    engine_completion_tokens: int | None
    reported_completion_tokens: int
    billed_completion_tokens: int
    unbilled_completion_tokens: int
    overbilled_completion_tokens: int
    upstream_errors: int
    # Refused by the proxy itself (limits, fields it cannot bill), never forwarded: neither
    # engine work nor a record, so they explain no drift (0 in windows of older proxies).
    refused_requests: int = 0
    verdicts: dict[str, int]
    causes: list[Cause]

    @field_validator("causes", mode="before")
    @classmethod
    def _coded(cls, value: Any) -> Any:
        """A window journaled before causes had codes: ``"code: sentence"``."""
        if not isinstance(value, list):
            return value
        return [_split(c) if isinstance(c, str) else c for c in value]

    def to_json(self) -> str:
        return self.model_dump_json()

    # The journal and the sinks handle windows beside usage records by these three.
    @property
    def record_id(self) -> str:
        return self.window_id

    @property
    def time(self) -> datetime:
        return self.end

    @property
    def tenant(self) -> str:
        return ""


# What the journal holds and the sinks deliver.
Entry = UsageRecord | SettledWindow


def parse_entry(body: str | bytes) -> Entry:
    """A journaled body back as a usage record or a reconciliation window."""
    if b'"kind":"reconciliation"' in (body.encode() if isinstance(body, str) else body):
        return SettledWindow.model_validate_json(body)
    return UsageRecord.from_json(body)


def settle(
    before: EngineReading,
    after: EngineReading,
    tally: Tally,
    *,
    start: datetime,
    end: datetime,
    instance: str,
    upstream: str,
    shared: bool = False,
) -> SettledWindow:
    """The window between two quiet readings. A counter that went down, or a changed
    engine start time, is a restart: the engine's growth is then unknown, so the window
    is reported (``counter_reset``) but no drift is claimed for it. With ``shared`` (other
    proxies send to the same engine) the growth holds their requests too: no unbilled
    tokens are claimed (``shared``), overbilling still is."""
    reset = after.prompt < before.prompt or after.generation < before.generation
    reset = reset or (before.started is not None and after.started != before.started)
    engine_prompt = None if reset else after.prompt - before.prompt
    engine_generation = None if reset else after.generation - before.generation
    unbilled_p, over_p = _drift(engine_prompt, tally.prompt_expected)
    unbilled_c, over_c = _drift(engine_generation, tally.completion_billed)
    others = unbilled_p, unbilled_c
    if shared:
        unbilled_p = unbilled_c = 0
    status = "counter_reset" if reset else "shared" if shared else "settled"
    found = causes(reset, unbilled_p + unbilled_c, over_p + over_c, tally)
    if shared and not reset:
        found.insert(0, _shared_cause(*others))
    return SettledWindow(
        window_id=new_record_id(),
        instance=instance,
        upstream=upstream,
        start=start,
        end=end,
        status=status,
        records=tally.records,
        engine_prompt_tokens=engine_prompt,
        reported_prompt_tokens=tally.prompt_reported,
        billed_prompt_tokens=tally.prompt_billed,
        unbilled_prompt_tokens=unbilled_p,
        overbilled_prompt_tokens=over_p,
        engine_completion_tokens=engine_generation,
        reported_completion_tokens=tally.completion_reported,
        billed_completion_tokens=tally.completion_billed,
        unbilled_completion_tokens=unbilled_c,
        overbilled_completion_tokens=over_c,
        upstream_errors=tally.upstream_errors,
        refused_requests=tally.refused,
        verdicts=dict(tally.verdicts),
        causes=found,
    )


def _split(text: str) -> dict[str, str]:
    code, _, message = text.partition(": ")
    return {"code": code, "message": message}


def _shared_cause(prompt: int, completion: int) -> Cause:
    return Cause(
        code=CauseCode.SHARED_UPSTREAM,
        message=f"{prompt} prompt and {completion} completion token(s) of the engine beyond "
        "this proxy's records: other proxies' requests, or unbilled work, not told apart "
        "(no unbilled tokens are claimed)",
    )


def _drift(engine: int | None, billed: int) -> tuple[int, int]:
    """(unbilled, overbilled) tokens; none claimed when the engine's growth is unknown."""
    if engine is None:
        return 0, 0
    return max(engine - billed, 0), max(billed - engine, 0)


def causes(reset: bool, unbilled: int, overbilled: int, tally: Tally) -> list[Cause]:
    """What can explain a drift, from what the proxy saw in the window."""
    found: list[tuple[CauseCode, str]] = []
    if reset:
        restarted = "the engine restarted; this window's growth is unknown"
        found.append((CauseCode.COUNTER_RESET, restarted))
    if unbilled and tally.upstream_errors:
        found.append(
            (
                CauseCode.UPSTREAM_ERRORS,
                f"{tally.upstream_errors} metered request(s) reached the upstream and failed "
                "there (work done before an error, e.g. prefill, is not billed; the proxy's "
                "own refusals are not among them: they never reached the engine)",
            )
        )
    if unbilled and tally.in_seconds:
        found.append(
            (
                CauseCode.BILLED_IN_SECONDS,
                f"{tally.in_seconds} whole transcription(s) billed in seconds of audio; the "
                "engine counted their tokens (decoder prompt and text), no token bill shows "
                "them",
            )
        )
    if (unbilled or overbilled) and tally.audio_streams:
        found.append((CauseCode.AUDIO_TOKENS, AUDIO_TOKENS.format(tally.audio_streams)))
    if unbilled:
        found.append(
            (
                CauseCode.UNMETERED_TRAFFIC,
                "engine work without a record of this proxy (requests that bypassed it, or "
                "paths it does not meter)",
            )
        )
    if (unbilled or overbilled) and tally.unproven:
        found.append(
            (
                CauseCode.UNPROVEN_RECORDS,
                f"{tally.unproven} record(s) billed as reported without proof (mismatch, "
                "unaudited or invalid: tokenizer, family or release assumptions)",
            )
        )
    if overbilled and not tally.unproven and not tally.audio_streams:
        found.append(
            (CauseCode.OVERBILLED, "records exceed the engine's count (a counting defect)")
        )
    return [Cause(code=code, message=message) for code, message in found]


# Measured on real vLLM 0.29.0 and 0.32.0 with Whisper (issue #49): a stream's usage is the
# last clip's decoder prompt plus ceil(seconds * 100) audio tokens (0.8.5: the audio tokens
# alone), while vllm:prompt_tokens_total grows by every clip's decoder prompt (4 tokens).
AUDIO_TOKENS = (
    "{} streamed transcription(s) or translation(s) billed vLLM's usage, whose "
    "prompt tokens count the audio (Whisper: one per log-mel frame, 100 a second) that the "
    "engine's prompt counter does not, and only the last 30-second clip's decoder prompt; "
    "without a language, Whisper also runs a one-token language detection no usage shows"
)
