"""Proof before trust: shortcuts for a model only after agreeing full recounts."""

from __future__ import annotations

from proxy.accounting.proof import Proofs, Standing
from proxy.accounting.types import EngineProfile, Family, Method, Release, ServedModel, Verdict


def model(name: str = "m", release: str = "0.29.0", root: str = "/models/m") -> ServedModel:
    profile = EngineProfile(Family.BI_ENCODER, 256, True, Release(release))
    return ServedModel(name, root, 256, profile, None)


def test_trusted_after_the_needed_agreeing_recounts() -> None:
    proofs, m = Proofs(needed=3), model()
    changes = [proofs.observe(m, v, Method.RECOUNT) for v in (Verdict.EXACT, Verdict.CORRECTED)]
    assert changes == [None, None]
    assert not proofs.trusted(m)
    change = proofs.observe(m, Verdict.CORRECTED, Method.RECOUNT)
    assert change is not None
    assert change.standing is Standing.TRUSTED
    assert change.proofs == 3
    assert proofs.trusted(m)
    assert proofs.standing(m) is Standing.TRUSTED


def test_only_full_recounts_prove() -> None:
    proofs, m = Proofs(needed=1), model()
    for method in (Method.DERIVED, Method.FORMULA, Method.NONE):
        assert proofs.observe(m, Verdict.CORRECTED, method) is None
    assert not proofs.trusted(m)
    assert proofs.observe(m, Verdict.UNAUDITED, Method.RECOUNT) is None
    assert not proofs.trusted(m)


def test_one_mismatch_distrusts_for_good() -> None:
    proofs, m = Proofs(needed=2), model()
    proofs.observe(m, Verdict.EXACT, Method.RECOUNT)
    proofs.observe(m, Verdict.EXACT, Method.RECOUNT)
    assert proofs.trusted(m)
    change = proofs.observe(m, Verdict.MISMATCH, Method.RECOUNT)
    assert change is not None
    assert change.standing is Standing.DISTRUSTED
    assert not proofs.trusted(m)
    assert proofs.standing(m) is Standing.DISTRUSTED
    for _ in range(5):  # later agreement never earns the trust back
        assert proofs.observe(m, Verdict.EXACT, Method.RECOUNT) is None
    assert not proofs.trusted(m)


def test_each_release_and_root_is_proven_anew() -> None:
    proofs = Proofs(needed=1)
    proofs.observe(model(), Verdict.EXACT, Method.RECOUNT)
    assert proofs.trusted(model())
    assert not proofs.trusted(model(release="0.30.0"))
    assert not proofs.trusted(model(root="/models/other"))
    assert not proofs.trusted(model(name="other"))
