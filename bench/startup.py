"""Import time of `deepthread --help` and of the start of `deepthread research`, from `python -X importtime`.

Each command runs in a fresh interpreter in an empty directory with no settings in the environment; the figure is
the cumulative import time (the sum over top-level imports, as CPython reports it), fastest of the rounds (the
least disturbed by other processes on a shared machine):

- `help`: `deepthread --help`;
- `research`: the start of `deepthread research "question"`: the command parsed, the question checked by the
  chat's rules and the settings read and validated, up to where the run's own modules load (measured as the run
  with a bad setting, which stops exactly there);
- `research_run` (for information): everything imported before the engine's first step (measured as the run with
  no LLM_MODEL, which stops after loading the engine, the LLM client, the storage models and the providers,
  before it opens the database), with the heaviest packages it pulls in.

    .venv/bin/python bench/startup.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.conftest import SETTINGS_PREFIXES  # noqa: E402
from tests.import_profile import ImportProfile, profile_command  # noqa: E402

QUESTION = "what changed in CPython 3.13?"
COMMANDS: dict[str, tuple[list[str], dict[str, str]]] = {
    "help": (["--help"], {}),
    "research": (["research", QUESTION], {"RESEARCH_MAX_ROUNDS": "0"}),
    "research_run": (["research", QUESTION], {}),
}
EXPECTED_EXIT_CODES = {"help": 0, "research": 2, "research_run": 2}


def clean_environment() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith(SETTINGS_PREFIXES)}


def heaviest_packages(profile: ImportProfile, count: int) -> list[tuple[str, float]]:
    """The packages whose own modules took longest to import (self time summed per top-level package)."""
    seconds: dict[str, float] = defaultdict(float)
    for module in profile.modules:
        seconds[module.name.split(".")[0]] += module.self_microseconds / 1e6
    return sorted(seconds.items(), key=lambda item: item[1], reverse=True)[:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    fastest: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as empty:
        for name, (command, settings) in COMMANDS.items():
            profiles = [profile_command(command, cwd=Path(empty), environment={**clean_environment(), **settings})
                        for _ in range(arguments.rounds)]
            if any(profile.returncode != EXPECTED_EXIT_CODES[name] for profile in profiles):
                raise SystemExit(f"{name}: unexpected exit code {profiles[0].returncode}: {profiles[0].stderr}")
            fastest[name] = min(profile.seconds for profile in profiles)
            print(f"{name:13} {fastest[name]:.3f} s of imports (fastest of {arguments.rounds}), "
                  f"{len(profiles[0].modules)} modules")
            typical = min(profiles, key=lambda profile: profile.seconds)
            print("  heaviest packages (s): " + ", ".join(f"{package} {seconds:.3f}"
                                                          for package, seconds in heaviest_packages(typical, 8)))
    print(f"help_import_s={fastest['help']:.3f} research_import_s={fastest['research']:.3f} "
          f"research_run_import_s={fastest['research_run']:.3f}")


if __name__ == "__main__":
    main()
