"""The duration of an uploaded audio file: the most audio any decoder vLLM's
speech-to-text may use reads from it. vLLM 0.32.0 decodes with torchcodec (FFmpeg) when it
is installed (its default), else with libsndfile (``soundfile``), else PyAV (FFmpeg).

libsndfile gives the frames and sample rate from the file's header. Where FFmpeg reads
more than a header says, the duration is FFmpeg's: a WAV whose data chunk says 0 bytes
(or 0xFFFFFFFF, as streaming writers leave it) is read by FFmpeg to the end of the file,
where libsndfile reads none (such a chunk of frames that are no whole number of bytes,
ADPCM or GSM, has no duration here: refused under a budget); an MP3, a FLAC and an Ogg
last every frame or packet they hold, which FFmpeg decodes whatever their first header
or last page says (each walked below, headers only).

Pure: bytes in, seconds out. No sample is decoded: headers only, every MP3/FLAC frame
header and Ogg packet walked (bounded: a day of audio, a million Ogg packets), off the
event loop with the form it comes from.
"""

from __future__ import annotations

import io
import re

import soundfile

# Past this much audio a file's frames are not walked further: no budget admits it (and
# vLLM refuses more than VLLM_MAX_AUDIO_DECODE_DURATION_S, 600 s by default).
MOST_SECONDS = 86_400

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
            frames, rate, kind = audio.frames, audio.samplerate, audio.format
    except (soundfile.LibsndfileError, RuntimeError, TypeError, ValueError):
        return None
    if rate <= 0 or frames < 0:
        return None
    if kind == "MP3":
        return max(float(frames) / float(rate), _mpeg_seconds(data))
    if kind == "OGG":  # its packets (libsndfile's count of a chained file is no length)
        return _ogg_seconds(data)
    if kind == "FLAC":
        walked = _flac_samples(data, rate)
        if walked is None:
            return None
        frames = max(frames, walked)
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


# MPEG audio (MP3): FFmpeg decodes every frame in the file, whatever a Xing/LAME header
# says (libsndfile trusts it: an MP3 of 1 s followed by 30 s of frames is 1 s to it, 31 s
# to FFmpeg). Every frame header is counted, each frame's samples at its own rate.
_MPEG_RATES = {3: (44100, 48000, 32000), 2: (22050, 24000, 16000), 0: (11025, 12000, 8000)}
_KBPS_V1 = {
    3: (0, 32, 64, 96, 128, 160, 192, 224, 256, 288, 320, 352, 384, 416, 448),
    2: (0, 32, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320, 384),
    1: (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
}
_KBPS_V2 = {
    3: (0, 32, 48, 56, 64, 80, 96, 112, 128, 144, 160, 176, 192, 224, 256),
    2: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
    1: (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
}
# A header's second byte: sync, a version that exists (not 01), a layer (not 00); its third:
# a bitrate index 1 to 14, a sample rate index 0 to 2. Every match is a whole header.
_SECOND = bytes(b for b in range(0xE0, 0x100) if (b >> 3) & 3 != 1 and (b >> 1) & 3 != 0)
_THIRD = bytes(b for b in range(256) if 1 <= b >> 4 <= 14 and (b >> 2) & 3 != 3)
_MPEG_HEADER = re.compile(
    b"\\xff[" + re.escape(_SECOND) + b"][" + re.escape(_THIRD) + b"]", re.DOTALL
)


def _mpeg_seconds(data: bytes) -> float:
    """The seconds of every MPEG audio frame header in ``data``, each frame skipped whole
    (a frame is 32 bytes or more, so the walk's steps are bounded by the file's size)."""
    total, at = 0.0, 0
    while (found := _MPEG_HEADER.search(data, at)) is not None:
        start = found.start()
        version, layer = (data[start + 1] >> 3) & 3, (data[start + 1] >> 1) & 3
        rate = _MPEG_RATES[version][(data[start + 2] >> 2) & 3]
        kbps = (_KBPS_V1 if version == 3 else _KBPS_V2)[layer][data[start + 2] >> 4]
        padding = (data[start + 2] >> 1) & 1
        if layer == 3:  # Layer I
            samples, length = 384, (12 * kbps * 1000 // rate + padding) * 4
        elif layer == 1 and version != 3:  # Layer III, MPEG-2 and 2.5
            samples, length = 576, 72 * kbps * 1000 // rate + padding
        else:
            samples, length = 1152, 144 * kbps * 1000 // rate + padding
        total += samples / rate
        if total > MOST_SECONDS:
            return total
        at = start + max(length, 4)
    return total


# FLAC: FFmpeg decodes every frame it finds, past STREAMINFO's total (libsndfile stops
# there: a FLAC of 1 s followed by another's 30 s is 1 s to it, 31 s to FFmpeg). Every
# frame header whose CRC-8 holds is counted; a file with many false ones is refused.
_FLAC_SYNC = re.compile(b"\\xff[\\xf8\\xf9]")
_FLAC_BLOCK = {1: 192, 2: 576, 3: 1152, 4: 2304, 5: 4608}
_FALSE_SYNCS = 10_000  # and one per KiB: random data holds one per 32 KiB


def _crc8_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = ((crc << 1) ^ 0x07) & 0xFF if crc & 0x80 else (crc << 1) & 0xFF
        table.append(crc)
    return tuple(table)


_CRC8 = _crc8_table()


def _crc8(data: bytes) -> int:
    """FLAC's frame header CRC-8 (polynomial 0x07)."""
    crc = 0
    for byte in data:
        crc = _CRC8[crc ^ byte]
    return crc


def _flac_samples(data: bytes, rate: int) -> int | None:
    """The samples of every FLAC frame header in ``data`` (its CRC-8 checked), or more
    once past ``MOST_SECONDS`` at ``rate``; None when too many syncs are false to walk."""
    total, at, false = 0, 0, 0
    allowed = _FALSE_SYNCS + len(data) // 1024
    while (found := _FLAC_SYNC.search(data, at)) is not None:
        start = found.start()
        at = start + 1
        block = _flac_header(data, start)
        if block is None:
            false += 1
            if false > allowed:
                return None
            continue
        total += block
        if total > MOST_SECONDS * rate:
            return total
    return total


def _flac_header(data: bytes, start: int) -> int | None:
    """The block size of a FLAC frame header at ``start``; None when none is there."""
    if start + 5 > len(data):
        return None
    size_code, rate_code = data[start + 2] >> 4, data[start + 2] & 15
    if size_code == 0 or rate_code == 15 or data[start + 3] & 1 or (data[start + 3] >> 1) & 7 == 3:
        return None
    at = start + 4
    first = data[at]  # the frame or sample number, UTF-8 coded in 1 to 7 bytes
    extra = next((n for n in range(7) if not first & (0x80 >> n)), 7)
    extra = 0 if extra == 0 else extra - 1
    at += 1 + extra
    block = _FLAC_BLOCK.get(size_code)
    if block is None and size_code in (6, 7):
        width = size_code - 5
        if at + width > len(data):
            return None
        block = int.from_bytes(data[at : at + width], "big") + 1
        at += width
    elif block is None:
        block = 256 << (size_code - 8)
    at += {12: 1, 13: 2, 14: 2}.get(rate_code, 0)
    if at >= len(data) or _crc8(data[start:at]) != data[at]:
        return None
    return block


# Ogg (Vorbis, Opus): FFmpeg decodes every packet, whatever the pages' granule positions
# say (libsndfile reads the last one: a 30 s Ogg whose last page says 1 s is 1 s to it,
# 30 s to FFmpeg). Every audio packet is counted: an Opus packet's samples from its TOC
# byte, a Vorbis packet at most half its long block (a bound: short blocks are less).
_OPUS_FRAME_MS = (10, 20, 40, 60, 10, 20, 40, 60, 10, 20, 40, 60, 10, 20, 10, 20)
# Packets walked at most (an hour of Opus in 20 ms packets is 180,000): a file of more,
# such as megabytes of empty packets, is refused rather than walked for seconds.
MOST_PACKETS = 1_000_000
_OPUS_FRAME_MS_CELT = (2.5, 5, 10, 20)


class _Stream:
    """One logical stream of an Ogg file: its codec, what sizes its packets, its seconds."""

    def __init__(self) -> None:
        self.packets = 0  # packets begun, header packets included
        self.kind = ""  # "vorbis", "opus", or "" (not yet known, or another codec)
        self.rate = 0
        self.long_block = 0
        self.seconds = 0.0

    def packet(self, head: bytes) -> None:
        """A packet begins with ``head`` (its first bytes, up to 30)."""
        self.packets += 1
        if self.packets == 1:
            if head.startswith(b"\x01vorbis") and len(head) >= 29:
                self.kind, self.rate = "vorbis", int.from_bytes(head[12:16], "little")
                self.long_block = 1 << (head[28] >> 4)
            elif head.startswith(b"OpusHead"):
                self.kind = "opus"
            return
        if self.kind == "vorbis" and self.packets > 3 and self.rate > 0:
            self.seconds += self.long_block / 2 / self.rate
        elif self.kind == "opus" and self.packets > 2 and head:
            self.seconds += _opus_seconds(head)


def _opus_seconds(head: bytes) -> float:
    """An Opus packet's length from its TOC byte (RFC 6716, 3.1)."""
    config, code = head[0] >> 3, head[0] & 3
    frame = _OPUS_FRAME_MS[config] if config < 16 else _OPUS_FRAME_MS_CELT[config % 4]
    frames = 1 if code == 0 else 2 if code in (1, 2) else (head[1] & 0x3F if len(head) > 1 else 0)
    return frame * frames / 1000


def _ogg_seconds(data: bytes) -> float | None:
    """The seconds of every audio packet of every Vorbis or Opus stream in ``data``;
    None when a stream is of another codec (not walked), or past ``MOST_PACKETS``."""
    streams: dict[int, _Stream] = {}
    heads: dict[int, bytearray] = {}  # a packet's first bytes, while it spans pages
    at = data.find(b"OggS")
    while at >= 0 and at + 27 <= len(data):
        serial = int.from_bytes(data[at + 14 : at + 18], "little")
        count = data[at + 26]
        lacing = data[at + 27 : at + 27 + count]
        body = at + 27 + count
        stream = streams.setdefault(serial, _Stream())
        head = heads.pop(serial, None)
        if head is None and not data[at + 5] & 1:
            head = bytearray()  # the page begins a packet
        for size in lacing:
            if head is not None and len(head) < 30:
                head += data[body : body + min(size, 30 - len(head))]
            body += size
            if size < 255:  # the packet ends here
                if head is not None:
                    stream.packet(bytes(head))
                head = bytearray()
        if head is not None and head:
            heads[serial] = head
        if stream.packets and not stream.kind:
            return None
        if sum(s.packets for s in streams.values()) > MOST_PACKETS:
            return None
        if sum(s.seconds for s in streams.values()) > MOST_SECONDS:
            break
        at = data.find(b"OggS", max(body, at + 4))
    return sum(s.seconds for s in streams.values())
