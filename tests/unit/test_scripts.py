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


def locked_releases() -> dict[str, tuple[str, list[str]]]:
    """requirements/lock.txt as {normalised name: (the pinned version, its sha256 hashes)}."""
    from packaging.utils import canonicalize_name

    releases: dict[str, tuple[str, list[str]]] = {}
    text = (ROOT / "requirements" / "lock.txt").read_text().replace("\\\n", " ")
    for line in text.splitlines():
        entry = line.split("#")[0].strip()
        if not entry:
            continue
        requirement, *options = entry.split(" --")
        name, separator, version = requirement.split(";")[0].strip().partition("==")
        assert separator and version, f"not pinned with ==: {line.strip()}"
        hashes = [option.removeprefix("hash=sha256:") for option in options if option.startswith("hash=sha256:")]
        assert hashes, f"no sha256 hash: {requirement}"
        releases[canonicalize_name(name.split("[")[0])] = (version, hashes)
    return releases


def test_every_dependency_of_pyproject_and_its_build_backend_is_locked_with_hashes() -> None:
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = [*project["project"]["dependencies"], *project["project"]["optional-dependencies"]["test"],
                *project["build-system"]["requires"]]
    releases = locked_releases()
    for line in declared:
        requirement = Requirement(line)
        name = canonicalize_name(requirement.name)
        assert name in releases, f"{requirement.name} is not in requirements/lock.txt: run scripts/lock"
        version, _hashes = releases[name]
        assert requirement.specifier.contains(version, prereleases=True), \
            f"the lock pins {name}=={version}, outside {line}: run scripts/lock"
    assert "pip" in releases  # scripts/setup's pip comes from the lock too, not from the newest release


def test_setup_and_the_image_install_only_from_the_lock_with_hashes() -> None:
    # CI runs .ci/run, which runs scripts/test, which runs scripts/setup.
    assert "scripts/test" in (ROOT / ".ci" / "run").read_text()
    assert "scripts/setup" in (ROOT / "scripts" / "test").read_text()
    setup = (ROOT / "scripts" / "setup").read_text()
    assert "requirements/lock.txt -nt" in setup, "a refreshed lock must reinstall .venv"
    dockerfile = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    for source, text in (("scripts/setup", setup), ("Dockerfile", dockerfile)):
        commands = [command.strip() for line in text.splitlines() if not line.lstrip().startswith("#")
                    for command in line.split("&&") if "pip install" in command or "pip wheel" in command]
        assert any("--require-hashes" in command and "-r requirements/lock.txt" in command for command in commands), \
            f"{source} does not install requirements/lock.txt with --require-hashes"
        for command in commands:
            # Anything else takes only what the locked install put there: no index, or no dependencies and no
            # isolated build (which would fetch the newest setuptools).
            assert ("--require-hashes" in command or "--no-index" in command
                    or ("--no-deps" in command and "--no-build-isolation" in command)), f"{source}: {command}"
