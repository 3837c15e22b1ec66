"""What ``make provision`` prints when an install fails: the registry's error, not the
warnings pip writes after it."""

from __future__ import annotations

from pathlib import Path

from scripts.provision import failure_of

NOISE = (
    "WARNING: Location 'file:///opt/pypi-more/simple/{}/' is ignored: "
    "it is neither a file nor a directory."
)


def test_a_failed_install_shows_its_error_through_the_index_warnings(tmp_path: Path) -> None:
    # Seen on a fresh machine: 133 such warnings after the error filled the 1,500
    # characters shown, and the message named no error at all.
    log = tmp_path / "provision-0.29.0.log"
    error = "ERROR: Could not find a version that satisfies the requirement av==14.4.0"
    log.write_text(
        "\n".join(["Collecting av==14.4.0", error, *(NOISE.format(i) for i in range(133))])
    )
    shown = failure_of(log)
    assert error in shown
    assert "is ignored" not in shown
    assert str(log) in shown
