"""`scripts/audit` over a fake pip-audit (PIP_AUDIT): what it says and how it exits for each report pip-audit can give,
above all that a run which could check nothing is never reported as clean.

`tests/data/pip_audit/every_package_skipped.json` is pip-audit 2.10.1's real report on requirements/lock.txt from a
machine whose route to pypi.org's JSON API answered nothing: every package skipped, and pip-audit itself said "No
known vulnerabilities found" and exited 0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
EVERY_PACKAGE_SKIPPED = ROOT / "tests" / "data" / "pip_audit" / "every_package_skipped.json"
# pip-audit as it behaves: the report to `--output FILE`, then "No known vulnerabilities found" on stderr however much
# it skipped; or, when the service cannot be reached, a traceback and no report.
FAKE_PIP_AUDIT = """\
import json, os, sys
arguments = sys.argv[1:]
with open(os.environ["FAKE_AUDIT_ARGV"], "w") as argv:
    json.dump(arguments, argv)
report = os.environ.get("FAKE_AUDIT_REPORT")
if report:
    with open(arguments[arguments.index("--output") + 1], "w") as output, open(report) as recorded:
        output.write(recorded.read())
    print("No known vulnerabilities found", file=sys.stderr)
else:  # the last line of the traceback pip-audit prints when it cannot reach the service
    print("requests.exceptions.ConnectionError: HTTPSConnectionPool(host='pypi.org', port=443)", file=sys.stderr)
sys.exit(int(os.environ.get("FAKE_AUDIT_EXIT", "0")))
"""


def run_audit(tmp_path: Path, report: dict[str, Any] | Path | None, *, exit_code: int = 0,
              arguments: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """scripts/audit with a pip-audit that writes `report` (None: writes none, as when the service is unreachable)."""
    fake = tmp_path / "pip-audit"
    fake.write_text(f"#!{sys.executable}\n{FAKE_PIP_AUDIT}")
    fake.chmod(0o755)
    environment = {**os.environ, "PIP_AUDIT": str(fake), "PYTHON": sys.executable,
                   "FAKE_AUDIT_ARGV": str(tmp_path / "argv.json"), "FAKE_AUDIT_EXIT": str(exit_code)}
    if isinstance(report, dict):
        written = tmp_path / "report.json"
        written.write_text(json.dumps(report))
        environment["FAKE_AUDIT_REPORT"] = str(written)
    elif isinstance(report, Path):
        environment["FAKE_AUDIT_REPORT"] = str(report)
    return subprocess.run(["bash", str(ROOT / "scripts" / "audit"), *arguments], env=environment,
                          capture_output=True, text=True, timeout=60)


def checked(name: str, version: str, *vulnerabilities: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "version": version, "vulns": list(vulnerabilities)}


def skipped(name: str, version: str) -> dict[str, Any]:
    return {"name": name, "skip_reason": f"Dependency not found on PyPI and could not be audited: {name} ({version})"}


def test_a_run_that_skipped_every_package_fails_and_never_says_no_known_vulnerabilities(tmp_path: Path) -> None:
    result = run_audit(tmp_path, EVERY_PACKAGE_SKIPPED)
    assert result.returncode == 2
    said = result.stdout + result.stderr
    assert "No known vulnerabilities found" not in said and "no known vulnerabilities" not in said.lower()
    assert said.startswith("Checked none of the 117 pinned packages in requirements/lock.txt: pip-audit could look "
                           "none of them up (for example: Dependency not found on PyPI")
    assert "This is not a clean audit." in said


def test_a_run_whose_service_was_unreachable_fails_saying_why(tmp_path: Path) -> None:
    result = run_audit(tmp_path, None, exit_code=1)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("Checked nothing: pip-audit stopped (exit 1) before it could report on "
                                    "requirements/lock.txt: requests.exceptions.ConnectionError: ")
    assert "This is not a clean audit." in result.stderr


def test_the_lock_is_audited_as_pinned_without_resolving_and_other_arguments_reach_pip_audit(tmp_path: Path) -> None:
    run_audit(tmp_path, {"dependencies": [checked("httpx", "0.28.1")], "fixes": []}, arguments=("-s", "osv"))
    arguments = json.loads((tmp_path / "argv.json").read_text())
    assert arguments[:2] == ["--requirement", "requirements/lock.txt"]
    assert {"--disable-pip", "--require-hashes"} <= set(arguments)
    assert arguments[arguments.index("--format") + 1] == "json" and arguments[-2:] == ["-s", "osv"]


def test_a_run_that_checked_every_package_and_found_nothing_passes(tmp_path: Path) -> None:
    report = {"dependencies": [checked("httpx", "0.28.1"), checked("pydantic", "2.12.0")], "fixes": []}
    result = run_audit(tmp_path, report)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "Checked 2 of 2 pinned packages in requirements/lock.txt: no known vulnerabilities.\n"


def test_a_vulnerable_pin_fails_naming_the_advisory_and_the_fixed_release(tmp_path: Path) -> None:
    report = {"dependencies": [
        checked("httpx", "0.28.1"),
        checked("jinja2", "3.1.4", {"id": "GHSA-q2x7-8rv6-6q7h", "fix_versions": ["3.1.5"], "aliases": []}),
        skipped("pydantic", "2.12.0"),
    ], "fixes": []}
    result = run_audit(tmp_path, report, exit_code=1)
    assert result.returncode == 1
    assert "jinja2 3.1.4: GHSA-q2x7-8rv6-6q7h (fixed in: 3.1.5)" in result.stdout
    assert "not checked: Dependency not found on PyPI and could not be audited: pydantic (2.12.0)" in result.stdout
    assert ("Checked 2 of 3 pinned packages in requirements/lock.txt: 1 package with known vulnerabilities"
            in result.stderr)


def test_a_run_that_could_check_only_some_packages_says_which_and_fails(tmp_path: Path) -> None:
    report = {"dependencies": [checked("httpx", "0.28.1"), skipped("pydantic", "2.12.0")], "fixes": []}
    result = run_audit(tmp_path, report)
    assert result.returncode == 3
    assert "not checked: Dependency not found on PyPI and could not be audited: pydantic (2.12.0)" in result.stdout
    assert "Checked 1 of 2 pinned packages in requirements/lock.txt: none of those has a known vulnerability, but " \
           "1 package could not be checked" in result.stderr
