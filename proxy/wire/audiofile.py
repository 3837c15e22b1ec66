"""The duration of an uploaded audio file, read by libsndfile (``soundfile``): the decoder
vLLM's speech-to-text reads a file with when torchcodec is absent, and whose frame count
it trusts for its own ``VLLM_MAX_AUDIO_DECODE_DURATION_S`` check.

Pure: bytes in, seconds out. Only the file's header is read (its frames and sample rate),
not its samples, so the time it takes does not grow with the audio; it still runs off the
event loop, with the form it comes from.
"""

from __future__ import annotations

import io

import soundfile


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
    return float(frames) / float(rate)
