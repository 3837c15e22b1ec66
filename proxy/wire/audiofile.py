"""The duration of an uploaded audio file: the most audio any decoder vLLM's
speech-to-text may use reads from it. vLLM 0.32.0 decodes with torchcodec (FFmpeg) when it
is installed (its default), else with libsndfile (``soundfile``), else PyAV (FFmpeg).

libsndfile gives the frames and sample rate from the file's header. Where FFmpeg reads
more than a header says, the duration is FFmpeg's: a WAV whose data chunk says 0 bytes
(or 0xFFFFFFFF, as streaming writers leave it) is read by FFmpeg to the end of the file,
where libsndfile reads none. Such a chunk in a WAV whose frames are not a whole number
of bytes (ADPCM, GSM) has no duration here (refused under a budget).

Pure: bytes in, seconds out. Only headers are read, not samples, so the time it takes
does not grow with the audio; it still runs off the event loop, with the form it comes
from.
"""

from __future__ import annotations

import io

import soundfile

# WAV format tags whose frames are ``block_align`` bytes each: PCM, IEEE float, A-law,
# mu-law, and WAVE_FORMAT_EXTENSIBLE (whose subformat is one of them or refused by both).
_FIXED_FRAMES = frozenset({0x0001, 0x0003, 0x0006, 0x0007, 0xFFFE})
# Data chunk sizes FFmpeg reads as "to the end of the file" (wavdec.c).
_UNSIZED = frozenset({0, 0xFFFFFFFF})


class _Unsized(Exception):
    """A WAV data chunk read to the end of the file whose frames have no fixed size."""


def seconds(data: bytes) -> float | None:
    """The audio's length in seconds; None when libsndfile cannot read the file (a
    container it does not know, such as MP4 or WebM, which vLLM decodes with FFmpeg)."""
    try:
        with soundfile.SoundFile(io.BytesIO(data)) as audio:
            frames, rate = audio.frames, audio.samplerate
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        return None
    if rate <= 0 or frames < 0:
        return None
    try:
        unsized = _wav_to_end(data)
    except _Unsized:
        return None
    if unsized is not None:
        frames = max(frames, unsized)
    return float(frames) / float(rate)


def _wav_to_end(data: bytes) -> int | None:
    """The frames FFmpeg reads from a RIFF WAV whose data chunk's size says 0 or
    0xFFFFFFFF (every byte after its header); None for any other file."""
    if data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return None
    at, frame, tag = 12, 0, 0
    while at + 8 <= len(data):
        name, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        body = at + 8
        if name == b"fmt " and size >= 14:
            tag = int.from_bytes(data[body : body + 2], "little")
            frame = int.from_bytes(data[body + 12 : body + 14], "little")  # block_align
        elif name == b"data":
            if size not in _UNSIZED:
                return None
            if tag not in _FIXED_FRAMES or frame <= 0:
                raise _Unsized
            return (len(data) - body) // frame
        at = body + size + size % 2
    return None
