"""Files read in the terminal: `deepthread research --file PATH [--files-only]` as a process against the fakes, and
`/attach PATH` in `deepthread chat`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pexpect
import pytest

from research.report import parse_report_json
from tests.fakes.corpus import QUESTION, Corpus
from tests.integration.terminal_chat import chat_with_a_worker
from tests.run_rows import all_runs, migrated_sqlite

pytestmark = pytest.mark.integration

# Prose first: the fake model restates a passage's first sentence, and a file opening with "# Title" would have it
# write a heading rather than a sentence the audit can check.
NOTES = ("The Zorblax pilot array delivered 41 megawatt hours in its first tidal month. "
         "Divers found the Zorblax turbine blades free of fouling after ninety days.\n\n"
         "## Next steps\n\nA second survey of the strait is planned.\n")
FIRST_FINDING = "The Zorblax pilot array delivered 41 megawatt hours in its first tidal month"
PNG = b"\x89PNG\r\n\x1a\n" + bytes(200)


@pytest.fixture
def corpus() -> Iterator[Corpus]:
    with Corpus() as running:
        yield running


@pytest.fixture
def notes(tmp_path: Path) -> Path:
    path = tmp_path / "notes.md"
    path.write_text(NOTES, encoding="utf-8")
    return path


def deepthread(corpus: Corpus, tmp_path: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    """`deepthread ARGUMENTS` in `tmp_path` (so `--file notes.md` is the file there), on the fakes, output captured."""
    environment = {**os.environ, **corpus.environment(), "DATABASE_URL": f"sqlite:///{tmp_path}/deepthread.db",
                   "DATA_DIR": str(tmp_path / "data"), "RESEARCH_MAX_ROUNDS": "1"}
    return subprocess.run([sys.executable, "-m", "bot.cli", *arguments], env=environment, cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)


def run_states(tmp_path: Path) -> list[str]:
    with migrated_sqlite(tmp_path) as (_, sessions):
        return [run.state for run in all_runs(sessions)]


def test_files_only_research_cites_the_file_and_searches_nothing(corpus: Corpus, tmp_path: Path, notes: Path) -> None:
    result = deepthread(corpus, tmp_path, "research", "--file", "notes.md", "--files-only", QUESTION)

    assert result.returncode == 0, result.stderr
    report = result.stdout
    sources = report.split("## Sources", 1)[1]
    assert re.search(r"(?m)^\[1\] notes\.md \(Markdown, shared file\) *$", sources), report
    findings = report.split("## Sources", 1)[0]
    assert f"{FIRST_FINDING} [1]." in findings, "the cited sentence is the file's"
    assert "Partial report" not in report
    assert corpus.search.requests("brave") == []
    # The live display, drawn on stderr: the read phase ticked off, and how the run ended.
    assert re.search(r"✔ Reading pages", result.stderr), result.stderr
    assert re.search(r"Run \d+ · Done", result.stderr), result.stderr
    assert run_states(tmp_path) == ["done"]


def test_the_json_report_describes_the_file_it_read(corpus: Corpus, tmp_path: Path, notes: Path) -> None:
    result = deepthread(corpus, tmp_path, "research", "--file", "notes.md", "--files-only", "--format", "json",
                        QUESTION)

    assert result.returncode == 0, result.stderr
    report = parse_report_json(result.stdout)
    [source] = report.sources
    data = notes.read_bytes()
    assert source.file is not None
    assert (source.file.name, source.file.kind, source.file.size) == ("notes.md", "markdown", len(data))
    assert re.fullmatch(r"[0-9a-f]{64}", source.file.sha256)
    assert source.file.sha256 == hashlib.sha256(data).hexdigest()
    cited = [passage for passage in report.cited_passages if passage.source_id == source.source_id]
    # The file's text, a heading's Markdown markers left out.
    assert cited and all(passage.text in NOTES.replace("## ", "") for passage in cited)
    assert json.loads(result.stdout)["usage"]["search_calls"].get("brave", 0) == 0


def test_files_only_without_a_file_and_a_missing_file_exit_2_and_say_why(corpus: Corpus, tmp_path: Path) -> None:
    lonely = deepthread(corpus, tmp_path, "research", "--files-only", QUESTION)
    assert lonely.returncode == 2
    assert "--files-only" in lonely.stderr and "--file" in lonely.stderr

    missing = deepthread(corpus, tmp_path, "research", "--file", "missing.pdf", QUESTION)
    assert missing.returncode == 2
    assert "missing.pdf" in missing.stderr
    assert lonely.stdout == missing.stdout == ""
    assert corpus.search.requests("brave") == [] and len(corpus.llm.requests) == 0


def test_a_refused_file_is_named_in_the_report_and_the_run_ends_done(corpus: Corpus, tmp_path: Path,
                                                                      notes: Path) -> None:
    (tmp_path / "diagram.png").write_bytes(PNG)
    result = deepthread(corpus, tmp_path, "research", "--file", "notes.md", "--file", "diagram.png", "--files-only",
                        QUESTION)

    assert result.returncode == 0, result.stderr
    assert re.search(r"(?m)^ℹ️ diagram\.png was not used: ", result.stdout), result.stdout
    assert re.search(r"(?m)^\[1\] notes\.md \(Markdown, shared file\) *$", result.stdout)
    assert "diagram.png (" not in result.stdout, "the refused file is no source"
    assert run_states(tmp_path) == ["done"]


def test_attach_in_the_chat_shares_the_file_and_files_only_research_cites_it(tmp_path: Path, redis_url: str,
                                                                              notes: Path) -> None:
    with Corpus() as corpus, chat_with_a_worker(corpus, tmp_path, redis_url) as (cluster, child):
        child.sendline("/attach notes.md")
        child.expect_exact("I'll use notes.md in this thread")
        child.expect("› ")
        assert all_runs(cluster.sessions) == [], "sharing a file starts nothing"

        child.sendline(f"files only: {QUESTION}")
        child.expect(r"Run (\d+) · research")
        run_id = int(child.match.group(1))
        child.expect_exact("notes.md (Markdown, shared file)")
        child.expect("› ")
        [run] = all_runs(cluster.sessions)
        assert (run.id, run.mode, run.state) == (run_id, "research", "done")
        assert run.options.files_only
        assert "notes.md (Markdown, shared file)" in run.report_markdown
        assert corpus.search.requests("brave") == []
        child.sendline("/quit")
        child.expect(pexpect.EOF)
