"""The design lives in the repository: README links docs/ARCHITECTURE.md and docs/STYLE.md, and no file points outside."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# A path that leaves the clone: the parent folder's shared documents or tools, or a home or machine folder.
OUTSIDE = re.compile(r"\.\./shared\b|\.\./\.\./|(?<![\w.])/(?:work|home|Users)/\w")


def tracked_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    files = [ROOT / name for name in names if not name.startswith("tests/data/")]
    return [path for path in files if path.is_file() and path.suffix in {".md", ".py", ".toml", ".yml", ".yaml",
                                                                          ".sh", ".txt", ".ini", ".cfg", ""}]


def test_readme_links_the_design_documents() -> None:
    readme = (ROOT / "README.md").read_text()
    for document in ("docs/ARCHITECTURE.md", "docs/STYLE.md"):
        assert (ROOT / document).is_file()
        assert f"]({document})" in readme


def test_no_file_points_outside_the_repository() -> None:
    this_file = Path(__file__).resolve()
    hits = [f"{path.relative_to(ROOT)}:{number}: {line.strip()}" for path in tracked_text_files() if path != this_file
            for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if OUTSIDE.search(line)]
    assert hits == []
