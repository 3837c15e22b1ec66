"""The ``--prices`` file read as a price schedule: per served model (and a default), a
price per unit a record carries, a currency and effective dates, as ``prices.PriceTable``.
The file is validated whole: an unknown unit, a price that is negative or no number, or
two prices of one model in force at once refuse it, and the table in use stays."""

from __future__ import annotations

import difflib
from datetime import UTC, date, datetime, time
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any
from zoneinfo import ZoneInfo

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    PrivateAttr,
    ValidationError,
    field_validator,
    model_validator,
)

from proxy.accounting.money import Amount, decimals_of, read_yaml_noting
from proxy.accounting.prices import PriceTable, Rate
from proxy.accounting.units import Unit
from proxy.accounting.zones import TimeZone

# LiteLLM's model price table (model_prices_and_context_window.json) names the same prices:
# per token, and per second of input audio (``input_cost_per_second`` is what it gives
# whisper; a vLLM model bills no other seconds).
LITELLM_NAMES = {
    "input_cost_per_token": Unit.PROMPT,
    "cache_read_input_token_cost": Unit.CACHED,
    "output_cost_per_token": Unit.COMPLETION,
    "input_cost_per_second": Unit.AUDIO,
    "input_cost_per_audio_per_second": Unit.AUDIO,
}


def _moment(value: object) -> date | datetime:
    if isinstance(value, date):  # a datetime is a date too
        return value
    if isinstance(value, str):
        try:
            text = value.strip()
            return date.fromisoformat(text) if len(text) == 10 else datetime.fromisoformat(text)
        except ValueError:
            pass
    raise ValueError(f"{value!r} is not an ISO 8601 date or time")


Moment = Annotated[date | datetime, PlainValidator(_moment)]


class Version(BaseModel):
    """One price of a model from ``from`` (absent: always before) until ``until`` (absent:
    the next one's ``from``, or for ever), per unit; LiteLLM's names are read as ours."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    start: Moment | None = Field(None, alias="from")
    until: Moment | None = None
    prompt_tokens: Amount | None = None
    cached_prompt_tokens: Amount | None = None
    completion_tokens: Amount | None = None
    audio_seconds: Amount | None = None

    @model_validator(mode="before")
    @classmethod
    def _our_names(cls, data: Any) -> Any:
        """LiteLLM's names as ours; an unknown name is left for ``extra="forbid"`` to
        refuse (so a price the proxy cannot meter is never dropped), each said with what
        it probably meant (``explain``)."""
        if not isinstance(data, dict):
            return data
        out: dict[str, Any] = {}
        for name, value in data.items():
            unit = LITELLM_NAMES.get(str(name))
            key = unit.value if unit is not None else str(name)
            if key in out:
                raise ValueError(f"{name}: the price of {key} is given twice")
            out[key] = value
        return out

    @model_validator(mode="after")
    def _priced(self) -> Version:
        if not self.prices():
            raise ValueError("no price: name at least one unit")
        return self

    def prices(self) -> tuple[tuple[Unit, Decimal], ...]:
        return tuple((u, p) for u in Unit if (p := getattr(self, u.value)) is not None)


Versions = list[Version]


class PriceFile(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    currency: str
    decimals: int | None = Field(None, ge=0, le=6)  # absent: the currency's (ISO 4217)
    timezone: TimeZone = "UTC"  # a date, or a time without an offset, is local to it
    default: Versions | None = None
    models: dict[str, Versions] = Field(default_factory=dict)

    _rates: dict[str | None, tuple[Rate, ...]] = PrivateAttr(default_factory=dict)

    @field_validator("currency")
    @classmethod
    def _code(cls, value: str) -> str:
        if len(value) != 3 or not value.isascii() or not value.isalpha() or not value.isupper():
            raise ValueError(f"{value!r} is not an ISO 4217 currency code (e.g. USD, EUR)")
        return value

    @field_validator("default", mode="before")
    @classmethod
    def _one_default(cls, value: Any) -> Any:
        return [value] if isinstance(value, dict) else value

    @field_validator("models", mode="before")
    @classmethod
    def _one_each(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {k: [v] if isinstance(v, dict) else v for k, v in value.items()}

    @model_validator(mode="after")
    def _in_force(self) -> PriceFile:
        zone = ZoneInfo(self.timezone)
        named: dict[str | None, Versions] = {None: self.default or []}
        named.update(self.models)
        for model, versions in named.items():
            self._rates[model] = _rates(model, versions, zone)
        return self

    def table(self) -> PriceTable:
        decimals = self.decimals if self.decimals is not None else decimals_of(self.currency)
        return PriceTable(self.currency, decimals, self._rates)


def _instant(value: date | datetime, zone: ZoneInfo) -> datetime:
    """A date is local midnight; a time without an offset is local; then UTC."""
    if not isinstance(value, datetime):
        value = datetime.combine(value, time(), zone)
    elif value.tzinfo is None:
        value = value.replace(tzinfo=zone)
    return value.astimezone(UTC)


def _rates(model: str | None, versions: Versions, zone: ZoneInfo) -> tuple[Rate, ...]:
    """The versions as rates in time order, each ending where it says or where the next
    begins; two in force at one instant are refused."""
    name = "default" if model is None else f"model {model!r}"
    timed = []
    for v in versions:
        start = _instant(v.start, zone) if v.start is not None else None
        until = _instant(v.until, zone) if v.until is not None else None
        if start is not None and until is not None and until <= start:
            raise ValueError(f"{name}: a price ends ({until}) before it starts ({start})")
        timed.append((start, until, v.prices()))
    timed.sort(key=lambda t: (t[0] is not None, t[0] or datetime.min.replace(tzinfo=UTC)))
    rates: list[Rate] = []
    for i, (start, until, prices) in enumerate(timed):
        following = timed[i + 1][0] if i + 1 < len(timed) else None
        if i + 1 < len(timed) and (following is None or start == following):
            raise ValueError(f"{name}: two prices start at {_said(start)}: they overlap")
        if until is not None and following is not None and until > following:
            raise ValueError(
                f"{name}: the price from {_said(start)} until {until.isoformat()} overlaps "
                f"the one from {following.isoformat()}"
            )
        rates.append(Rate(start, until or following, prices))
    return tuple(rates)


def _said(moment: datetime | None) -> str:
    return moment.isoformat() if moment else "the beginning (no 'from')"


def load_prices(path: Path) -> PriceTable:
    """Read and validate a price file (YAML or JSON); raises on anything wrong."""
    return load_price_file(path).table()


class PriceFileError(ValueError):
    """A price file that names a key twice, with every other problem it has (one pass)."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def load_price_file(path: Path) -> PriceFile:
    """The price file as written (its ``timezone`` too); raises on anything wrong (a key
    given twice: ``PriceFileError``, with the file's other problems)."""
    data, twice = read_yaml_noting(path.read_text(encoding="utf-8"))
    found = [problem.said() for problem in twice]
    try:
        prices = PriceFile.model_validate(data if data is not None else {})
    except ValidationError as exc:
        if not found:
            raise
        raise PriceFileError([*found, *explain(exc)]) from None
    if found:
        raise PriceFileError(found)
    return prices


def one_line(exc: Exception) -> str:
    """A refused file said in one line: each problem with where it is."""
    if isinstance(exc, ValidationError):
        return "; ".join(explain(exc))
    return " ".join(str(exc).split())


# The keys of a LiteLLM model entry that are no prices (model_prices_and_context_window.json).
LITELLM_OTHER = frozenset(
    {
        "max_tokens",
        "max_input_tokens",
        "max_output_tokens",
        "litellm_provider",
        "mode",
        "source",
        "metadata",
        "deprecation_date",
        "output_vector_size",
        "tool_use_system_prompt_tokens",
    }
)
TOP = ("currency", "decimals", "timezone", "default", "models")
UNIT_NAMES = (*(u.value for u in Unit), *LITELLM_NAMES)


def explain(exc: ValidationError) -> list[str]:
    """Every problem of a refused file, one sentence each, in the file's words: a name it
    does not know with what it probably meant, a LiteLLM entry pasted whole said once."""
    said: list[str] = []
    pasted: dict[str, list[str]] = {}
    for e in exc.errors():
        loc = [str(p) for p in e["loc"]]
        where, name = ".".join(loc[:-1]), loc[-1] if loc else ""
        litellm = name in LITELLM_OTHER or name.startswith("supports_")
        if e["type"] == "extra_forbidden" and litellm:
            pasted.setdefault(where, []).append(name)
        elif e["type"] == "extra_forbidden":
            said.append(_unknown(where, name))
        else:
            message = e["msg"].removeprefix("Value error, ")
            said.append(f"{'.'.join(loc) or 'file'}: {message}")
    for where, names in pasted.items():
        said.append(
            f"{where}: {', '.join(names)} are no prices: a LiteLLM entry is pasted whole; "
            "copy its price fields only (input_cost_per_token, output_cost_per_token, ...)"
        )
    return said


def _unknown(where: str, name: str) -> str:
    """A name the file's shape does not have, and the one it probably meant."""
    if not where:
        near = difflib.get_close_matches(name, TOP, n=1, cutoff=0.6)
        known = ", ".join(TOP)
        return f"{name!r} is not a key of a price file ({known}){_meant(near)}"
    near = difflib.get_close_matches(name, UNIT_NAMES, n=1, cutoff=0.8)
    ours = ", ".join(u.value for u in Unit)
    return (
        f"{where}: unknown unit {name!r}: a price names one of {ours} (or LiteLLM's "
        f"{', '.join(LITELLM_NAMES)}){_meant(near)}"
    )


def _meant(near: list[str]) -> str:
    return f"; did you mean {near[0]!r}?" if near else ""
