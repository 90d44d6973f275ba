"""The README's run command on a fresh clone with no settings: one plain line, and nothing created."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_scripts_run_without_env_says_how_to_start_in_one_line_and_creates_nothing(tmp_path: Path) -> None:
    clone = tmp_path / "clone"
    shutil.copytree(ROOT / "scripts", clone / "scripts")
    shutil.copy(ROOT / ".env.example", clone / ".env.example")
    before = sorted(path.relative_to(clone) for path in clone.rglob("*"))
    environment = {key: value for key, value in os.environ.items() if not key.startswith("LLM_")}
    result = subprocess.run(["bash", "scripts/run"], cwd=clone, env=environment, capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "cp .env.example .env" in result.stderr
    assert sorted(path.relative_to(clone) for path in clone.rglob("*")) == before


def test_the_package_metadata_uses_no_deprecated_setuptools_form() -> None:
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert isinstance(project["project"]["license"], str), "an SPDX string, not the deprecated {text = ...} table"
    assert "setuptools>=77" in project["build-system"]["requires"], "the first setuptools that reads SPDX licences"
    assert 'PYTHONWARNINGS="ignore::UserWarning"' in (ROOT / "scripts" / "setup").read_text()
