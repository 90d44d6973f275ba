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

Only the command's own process is counted (not the CPU pool's helper processes it starts). Each round runs every
command once, after a fixed piece of pure-Python work whose time (`cpu_loop_s`) shows how fast the machine was.

    .venv/bin/python bench/startup.py [--rounds 7]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
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


def cpu_loop_seconds() -> float:
    """How long this machine takes, right now, for a fixed piece of pure-Python work (about a tenth of a second on the
    2-core machine of bench/README.md at its fastest): shared machines run at very different speeds minute to minute,
    and this says how fast a round's machine was."""
    started = time.perf_counter()
    total = 0
    for number in range(3_000_000):
        total += number
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7)
    arguments = parser.parse_args()
    profiles: dict[str, list[ImportProfile]] = {name: [] for name in COMMANDS}
    loops: list[float] = []
    with tempfile.TemporaryDirectory() as empty:
        # Round by round, every command once: a slow minute on a shared machine slows each command alike.
        for _ in range(arguments.rounds):
            loops.append(cpu_loop_seconds())
            for name, (command, settings) in COMMANDS.items():
                profile = profile_command(command, cwd=Path(empty), environment={**clean_environment(), **settings})
                if profile.returncode != EXPECTED_EXIT_CODES[name]:
                    raise SystemExit(f"{name}: unexpected exit code {profile.returncode}: {profile.stderr}")
                profiles[name].append(profile)
    fastest: dict[str, float] = {}
    for name, rounds in profiles.items():
        fastest[name] = min(profile.seconds for profile in rounds)
        print(f"{name:13} {fastest[name]:.3f} s of imports (fastest of {arguments.rounds}; slowest "
              f"{max(profile.seconds for profile in rounds):.3f}), {len(rounds[0].modules)} modules")
        typical = min(rounds, key=lambda profile: profile.seconds)
        print("  heaviest packages (s): " + ", ".join(f"{package} {seconds:.3f}"
                                                      for package, seconds in heaviest_packages(typical, 8)))
    print(f"cpu_loop_s: fastest {min(loops):.3f}, slowest {max(loops):.3f} (the same work before each round)")
    print(f"help_import_s={fastest['help']:.3f} research_import_s={fastest['research']:.3f} "
          f"research_run_import_s={fastest['research_run']:.3f} cpu_loop_s={min(loops):.3f}")


if __name__ == "__main__":
    main()
