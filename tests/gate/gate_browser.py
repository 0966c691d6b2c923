"""Rendering report.html in headless Chromium (Debian's package, which .ci/run
installs) and reading the op matrix back out of the DOM the browser built."""

from __future__ import annotations

import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")

needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists(), reason="Debian's chromium is not installed (/usr/bin/chromium)"
)


class MatrixReader(HTMLParser):
    """Collects the matrix's rows (their data-op) and the classes of their cells."""

    def __init__(self) -> None:
        super().__init__()
        self.in_matrix = False
        self.rows: list[str] = []
        self.cell_classes: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        """Note the matrix's rows and cell classes as they open."""
        attributes = dict(attrs)
        if tag == "table":
            self.in_matrix = attributes.get("id") == "matrix"
        elif self.in_matrix and tag == "tr" and attributes.get("data-op"):
            self.rows.append(attributes["data-op"])  # type: ignore[arg-type]
        elif self.in_matrix and tag == "td" and attributes.get("class"):
            self.cell_classes.append(attributes["class"])  # type: ignore[arg-type]

    def handle_endtag(self, tag: str) -> None:
        """Leave the matrix when its table closes."""
        if tag == "table":
            self.in_matrix = False


def rendered_dom(page: Path, profile: Path) -> str:
    """The DOM Chromium built from `page`, serialised after loading it."""
    command = [
        str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
        f"--user-data-dir={profile}", "--dump-dom", page.as_uri(),
    ]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, check=True).stdout


def rendered_matrix(page: Path, profile: Path) -> MatrixReader:
    """The matrix of `page` as Chromium rendered it."""
    reader = MatrixReader()
    reader.feed(rendered_dom(page, profile))
    return reader
