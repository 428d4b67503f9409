"""tests/images/apt_mirror.py: the image build reads the Debian mirror from the machine's apt sources."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

_PATH = Path(__file__).resolve().parents[2] / "images" / "apt_mirror.py"
_spec = importlib.util.spec_from_file_location("apt_mirror", _PATH)
assert _spec and _spec.loader
apt_mirror = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(apt_mirror)


def test_one_line_format_skips_comments_options_and_other_suites(tmp_path: Path) -> None:
    f = tmp_path / "sources.list"
    f.write_text(
        "# deb http://old.example/debian bookworm main\n"
        "deb-src http://src.example/debian bookworm main\n"
        "deb http://sec.example/debian-security bookworm-security main\n"
        "deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib\n"
    )
    assert apt_mirror._one_line(str(f), "bookworm") == "http://mirror.example/debian"
    assert apt_mirror._one_line(str(f), "trixie") is None


def test_deb822_picks_the_stanza_with_suite_and_main(tmp_path: Path) -> None:
    f = tmp_path / "debian.sources"
    f.write_text(
        "Types: deb\nURIs: http://sec.example/debian-security\n"
        "Suites: bookworm-security\nComponents: main\n\n"
        "Types: deb\nURIs: http://off.example/debian\nSuites: bookworm\nComponents: main\nEnabled: no\n\n"
        "Types: deb deb-src\n# comment line\nURIs: http://mirror.example/debian\n"
        "Suites: bookworm bookworm-updates\nComponents: main\n"
    )
    assert apt_mirror._deb822(str(f), "bookworm") == "http://mirror.example/debian"
    assert apt_mirror._deb822(str(f), "bookworm-security") == "http://sec.example/debian-security"
    assert apt_mirror._deb822(str(f), "bullseye") is None
