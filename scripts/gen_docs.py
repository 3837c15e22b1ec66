"""Regenerate the README's configuration reference from the settings model."""

from __future__ import annotations

from pathlib import Path

from proxy.settings import reference_table

README = Path(__file__).resolve().parent.parent / "README.md"
START, END = "<!-- config:start -->\n", "<!-- config:end -->"

text = README.read_text()
head, rest = text.split(START)
_, tail = rest.split(END)
README.write_text(head + START + reference_table() + END + tail)
