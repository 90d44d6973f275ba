"""What set-up says on a fresh clone: a line before the long, quiet install; and `scripts/run` says how to put
`deepthread` on PATH when it is not there.

The scripts run for real in a scratch copy of the repository, with a stand-in Python whose `-m venv` makes a `.venv`
of stand-ins: nothing is installed, and each step says on stderr that it ran, so the order of the output is the order
of the steps.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
INSTALLING = "Installing deepthread and its Python packages into .venv (about 3½ minutes on a fresh clone)…"

STAND_IN_PYTHON = f"""#!/usr/bin/env bash
# python3 for scripts/setup: the version check is the real one; `-m venv DIR` makes a venv of stand-ins.
if [ "$1" = -m ] && [ "$2" = venv ]; then
  echo "step: venv" >&2
  mkdir -p "$3/bin"
  printf '#!/usr/bin/env bash\\necho "step: pip $*" >&2\\n' > "$3/bin/python"
  printf '#!/usr/bin/env bash\\necho "step: deepthread $*" >&2\\n' > "$3/bin/deepthread"
  chmod +x "$3/bin/python" "$3/bin/deepthread"
  exit 0
fi
exec {sys.executable} "$@"
"""


def scratch_clone(tmp_path: Path) -> Path:
    clone = tmp_path / "clone"
    (clone / "scripts").mkdir(parents=True)
    (clone / "requirements").mkdir()
    for script in ("setup", "run"):
        shutil.copy2(ROOT / "scripts" / script, clone / "scripts" / script)
    shutil.copy2(ROOT / "pyproject.toml", clone / "pyproject.toml")
    shutil.copy2(ROOT / "requirements" / "lock.txt", clone / "requirements" / "lock.txt")
    (clone / ".env").write_text("LLM_MODEL=gpt-test\n")
    python = tmp_path / "python3"
    python.write_text(STAND_IN_PYTHON)
    python.chmod(0o755)
    return clone


def run(clone: Path, script: str, path: str | None = None) -> list[str]:
    env = {"PATH": path or os.environ["PATH"], "PYTHON": str(clone.parent / "python3"), "HOME": str(clone.parent)}
    result = subprocess.run([str(clone / "scripts" / script)], cwd=clone, env=env, capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stderr.splitlines()


def test_set_up_says_it_installs_before_the_quiet_minutes_and_nothing_when_there_is_nothing_to_do(
    tmp_path: Path,
) -> None:
    clone = scratch_clone(tmp_path)

    first = run(clone, "setup")
    second = run(clone, "setup")

    assert first[0] == INSTALLING
    assert first[1:] == ["step: venv", "step: pip -m pip install --quiet --require-hashes -r requirements/lock.txt",
                         "step: pip -m pip install --quiet --no-deps --no-build-isolation -e ."]
    assert second == []


def test_run_says_how_to_put_deepthread_on_path_unless_it_is_there(tmp_path: Path) -> None:
    clone = scratch_clone(tmp_path)
    path_without_venv = os.pathsep.join(entry for entry in os.environ["PATH"].split(os.pathsep)
                                        if not (Path(entry) / "deepthread").exists())

    outside = run(clone, "run", path_without_venv)
    inside = run(clone, "run", os.pathsep.join([str(clone / ".venv" / "bin"), path_without_venv]))

    assert outside[0] == INSTALLING
    assert "`source .venv/bin/activate` puts it on your PATH" in outside[-2]
    assert outside[-1] == "step: deepthread up"
    assert inside == ["step: deepthread up"]
