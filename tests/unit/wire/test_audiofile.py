"""An uploaded audio's duration as libsndfile reads it: WAV at any rate, FLAC; None for
what it cannot read."""

from __future__ import annotations

import io

import numpy as np
import pytest
import soundfile
from hypothesis import given
from hypothesis import strategies as st

from proxy.wire.audiofile import seconds
from tests.support.fakevllm.audio import wav


@pytest.mark.parametrize(("length", "rate"), [(2.5, 16000), (3600, 8), (0.0, 16000), (1, 44100)])
def test_a_wav_lasts_its_frames_over_its_rate(length: float, rate: int) -> None:
    """The header's frames over its sample rate, whatever the rate."""
    assert seconds(wav(length, rate=rate)) == pytest.approx(length)


def test_a_flac_is_read_too() -> None:
    """A compressed file libsndfile decodes: its frames, not its bytes."""
    out = io.BytesIO()
    soundfile.write(out, np.zeros(48000, dtype="int16"), 16000, format="FLAC")
    assert seconds(out.getvalue()) == pytest.approx(3.0)


@pytest.mark.parametrize("data", [b"", b"RIFF1234", b"\0" * 4096, b"ftypM4A " * 64])
def test_what_libsndfile_cannot_read_has_no_duration(data: bytes) -> None:
    """Nothing, a truncated header, zeros, an MP4 container: None (never an error)."""
    assert seconds(data) is None


@given(st.binary(max_size=2048))
def test_any_bytes_give_a_duration_or_none(data: bytes) -> None:
    """Whatever a client uploads: a duration or None, never an error (a pricing job that
    raised would fail the request instead of refusing it)."""
    found = seconds(b"RIFF" + data)
    assert found is None or found >= 0
    found = seconds(data)
    assert found is None or found >= 0
