"""Proof before trust: a shortcut stands in for a full recount of a model only once full
recounts of that model, on that release, have proven the proxy reads it right.

The shortcuts are the derivation (``--recount-fraction`` below 1: a sampled-out request is
judged from the reported count and the query length alone) and the formula verdicts of the
families whose report vLLM gets right by construction (one engine input per pair). Both
stake the bill on the proxy's idea of the model's family and of its release. Until
``needed`` full recounts of the model came out ``exact`` or ``corrected``, every request of
it is recounted in full; one ``mismatch`` on a full recount distrusts the model for good
(until it is served anew): the proxy's reading of it is wrong, and a shortcut built on that
reading would bill a wrong number without noticing.

Pure: the serving layer calls ``observe`` on its event loop; ``trusted`` is one read of an
immutable set, safe from the tokenizer threads.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from proxy.accounting.types import Method, ServedModel, Verdict

# Full recounts that must agree before a shortcut is trusted.
PROOFS_NEEDED = 3


@dataclass(frozen=True, slots=True)
class ModelKey:
    """A model as served: a new root, length or release is a new model to prove."""

    name: str
    root: str
    max_model_len: int
    release: str | None

    @classmethod
    def of(cls, model: ServedModel) -> ModelKey:
        release = model.profile.release.version if model.profile else None
        return cls(model.name, model.root, model.max_model_len, release)


class Standing(enum.StrEnum):
    PROVING = "proving"  # recounted in full until proven
    TRUSTED = "trusted"  # proven: shortcuts allowed
    DISTRUSTED = "distrusted"  # a full recount disagreed: recounted in full for good


@dataclass(frozen=True, slots=True)
class Change:
    """A model's standing changed (logged and measured by the caller)."""

    model: str
    standing: Standing
    proofs: int
    reason: str | None = None


class Proofs:
    """Per served model: full recounts that agreed, and whether one disagreed."""

    def __init__(self, needed: int = PROOFS_NEEDED) -> None:
        self.needed = needed
        self._agreed: dict[ModelKey, int] = {}
        self._distrusted: dict[ModelKey, str] = {}
        self._trusted: frozenset[ModelKey] = frozenset()

    def trusted(self, model: ServedModel) -> bool:
        """Whether a shortcut may stand in for a full recount of ``model``."""
        return ModelKey.of(model) in self._trusted

    def standing(self, model: ServedModel) -> Standing:
        key = ModelKey.of(model)
        if key in self._distrusted:
            return Standing.DISTRUSTED
        return Standing.TRUSTED if key in self._trusted else Standing.PROVING

    def observe(self, model: ServedModel, verdict: Verdict, method: Method) -> Change | None:
        """Take one judged request of ``model`` into account; the change it made, if any.

        Only full recounts prove or disprove: a derived or formula verdict proves nothing.
        """
        if method is not Method.RECOUNT:
            return None
        key = ModelKey.of(model)
        if key in self._distrusted:
            return None
        agreed = self._agreed.get(key, 0)
        if verdict is Verdict.MISMATCH:
            self._distrusted[key] = "a full recount disagreed with the upstream's report"
            self._agreed.pop(key, None)
            self._trusted = self._trusted - {key}
            return Change(model.name, Standing.DISTRUSTED, agreed, self._distrusted[key])
        if verdict not in (Verdict.EXACT, Verdict.CORRECTED):
            return None
        self._agreed[key] = agreed + 1
        if agreed + 1 == self.needed:
            self._trusted = self._trusted | {key}
            return Change(model.name, Standing.TRUSTED, agreed + 1)
        return None
