"""An uploaded audio's duration as libsndfile reads it: WAV at any rate, FLAC; None for
what it cannot read."""

from __future__ import annotations

import io
import time

import numpy as np
import pytest
import soundfile
from hypothesis import given, settings
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


def _sized(audio: bytes, size: int) -> bytes:
    """``audio`` (a WAV) with its data chunk's size field set to ``size``."""
    at = audio.index(b"data") + 4
    return audio[:at] + size.to_bytes(4, "little") + audio[at + 4 :]


@pytest.mark.parametrize(("size", "length"), [(0, 60.0), (0xFFFFFFFF, 60.0), (32000, 1.0)])
def test_a_wav_lasts_what_ffmpeg_reads_of_it(size: int, length: float) -> None:
    """vLLM 0.32.0 decodes with torchcodec (FFmpeg): a data chunk whose size says 0 or
    0xFFFFFFFF is read to the end of the file (libsndfile reads 0 frames of the first);
    one that says less than the file holds, that much (as measured with PyAV 18.1 on
    FFmpeg 8.1: 60.0, 60.0, 1.0)."""
    assert seconds(_sized(wav(60), size)) == pytest.approx(length)


def test_an_unsized_wav_of_frames_without_a_fixed_size_has_no_duration() -> None:
    """IMA ADPCM frames are no whole number of bytes: with a data chunk read to the end
    of the file there is no duration to price it by (refused under a budget)."""
    out = io.BytesIO()
    soundfile.write(out, np.zeros(16000, dtype="int16"), 16000, format="WAV", subtype="IMA_ADPCM")
    assert seconds(out.getvalue()) == pytest.approx(1.0, abs=0.05)  # its last block padded
    assert seconds(_sized(out.getvalue(), 0)) is None


def _encoded(length: float, kind: str) -> bytes:
    """``length`` seconds of noise at 16 kHz, encoded by libsndfile as ``kind``."""
    noise = np.random.default_rng(0).standard_normal(int(16000 * length)) * 0.1
    out = io.BytesIO()
    soundfile.write(out, noise.astype("float32"), 16000, format=kind)
    return out.getvalue()


@pytest.mark.parametrize(("kind", "ffmpeg"), [("MP3", 31.143), ("FLAC", 31.0)])
def test_a_file_followed_by_more_frames_lasts_every_frame(kind: str, ffmpeg: float) -> None:
    """1 s of MP3 (or FLAC) followed by 30 s more: libsndfile trusts the first file's
    header (Xing, STREAMINFO) and reads 1 s; FFmpeg, which vLLM 0.32.0 decodes with,
    decodes every frame (measured with PyAV 18.1 on FFmpeg 8.1: 31.143 and 31.0 s). The
    duration is at least FFmpeg's, and within a frame per file and the encoder's padding
    of it."""
    found = seconds(_encoded(1, kind) + _encoded(30, kind))
    assert found is not None
    assert ffmpeg <= found < ffmpeg + 0.5


@pytest.mark.parametrize("kind", ["MP3", "FLAC"])
def test_a_whole_file_lasts_about_its_header(kind: str) -> None:
    """A file as encoded: its frames' length, within a frame and the encoder's padding."""
    found = seconds(_encoded(20, kind))
    assert found is not None
    assert 20 <= found < 20.5


def test_a_flac_full_of_false_frame_syncs_has_no_duration() -> None:
    """A FLAC followed by megabytes of bytes that look like frame syncs but are none (their
    CRC-8 fails): too many to walk, so no duration (refused under a budget), quickly."""
    assert seconds(_encoded(1, "FLAC") + b"\xff\xf8\x69\x08" * 1_000_000) is None


def _ogg(length: float, subtype: str, seed: int = 0) -> bytes:
    """``length`` seconds of noise as an Ogg file of ``subtype`` (Opus at 48 kHz)."""
    rate = 48000 if subtype == "OPUS" else 16000
    noise = np.random.default_rng(seed).standard_normal(int(rate * length)) * 0.1
    out = io.BytesIO()
    soundfile.write(out, noise.astype("float32"), rate, format="OGG", subtype=subtype)
    return out.getvalue()


def _ogg_crc(page: bytes) -> int:
    """An Ogg page's CRC-32 (polynomial 0x04C11DB7, unreflected)."""
    crc = 0
    for byte in page:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else crc << 1
            crc &= 0xFFFFFFFF
    return crc


def _last_granule(data: bytes, granule: int) -> bytes:
    """``data`` (Ogg) with its last page's granule position set to ``granule``."""
    page = bytearray(data[data.rfind(b"OggS") :])
    page[6:14] = granule.to_bytes(8, "little")
    page[22:26] = bytes(4)
    page[22:26] = _ogg_crc(bytes(page)).to_bytes(4, "little")
    return data[: data.rfind(b"OggS")] + bytes(page)


@pytest.mark.parametrize(
    ("subtype", "rate", "ffmpeg"), [("VORBIS", 16000, 30.0), ("OPUS", 48000, 29.534)]
)
def test_an_ogg_whose_last_page_says_less_lasts_its_packets(
    subtype: str, rate: int, ffmpeg: float
) -> None:
    """30 s of Ogg whose last page's granule position says 1 s: libsndfile reads 1 s,
    FFmpeg (vLLM 0.32.0's torchcodec) decodes every packet (measured with PyAV 18.1 on
    FFmpeg 8.1: 30.0 and 29.534 s). The duration is at least FFmpeg's."""
    audio = _last_granule(_ogg(30, subtype), rate)
    with soundfile.SoundFile(io.BytesIO(audio)) as read:
        assert read.frames / read.samplerate < 1.01
    found = seconds(audio)
    assert found is not None
    assert ffmpeg <= found < ffmpeg + 0.6


@pytest.mark.parametrize(("subtype", "ffmpeg"), [("VORBIS", 31.016), ("OPUS", 31.0)])
def test_a_chained_ogg_lasts_every_stream(subtype: str, ffmpeg: float) -> None:
    """1 s of Ogg followed by another file's 30 s (a chained Ogg): libsndfile's count is
    no length, FFmpeg decodes both (31.016 and 31.0 s, measured as above)."""
    found = seconds(_ogg(1, subtype) + _ogg(30, subtype, seed=1))
    assert found is not None
    assert ffmpeg <= found < ffmpeg + 0.6


def test_an_ogg_of_megabytes_of_empty_packets_is_refused_quickly() -> None:
    """Pages of 255 empty packets each, 24 MB of them, after 1 s of Opus: more packets
    than are walked, so no duration (refused under a budget), in well under a second of
    walking (before the bound: 11 s of CPU for one upload)."""
    head = _ogg(1, "OPUS")
    page = b"OggS\0\0" + bytes(8) + head[14:18] + bytes(8) + b"\xff" + bytes(255)
    audio = head + page * (24_000_000 // len(page))
    started = time.perf_counter()
    assert seconds(audio) is None
    assert time.perf_counter() - started < 5


_REAL = {kind: _encoded(2, kind) for kind in ("MP3", "FLAC")} | {"OGG": _ogg(2, "OPUS")}


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(sorted(_REAL)),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=20),
    st.integers(0, 10**6),
)
def test_a_damaged_file_gives_a_duration_or_none(
    kind: str, changes: list[tuple[int, int]], cut: int
) -> None:
    """A real MP3, FLAC or Ogg with bytes changed and cut short, as a hostile client may
    send it: the frame and packet walks give a duration or None, never an error."""
    audio = bytearray(_REAL[kind])
    for at, value in changes:
        audio[at % len(audio)] = value
    found = seconds(bytes(audio[: max(1, len(audio) - cut % len(audio))]))
    assert found is None or found >= 0
