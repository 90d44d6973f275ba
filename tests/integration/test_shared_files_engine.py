"""Files shared with a run are sources like the web's: read, ranked, cited with their pages, audited; "files only"
calls no search provider; a file that cannot be read is named and the run goes on."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from research import engine
from research.engine import ResearchState
from research.files import FILE_PROVIDER, FileRef, LocalFiles
from research.phases.files import FileLimits
from research.report import render_html, render_markdown
from tests.fakes.corpus import Corpus, options
from tests.fakes.shared_files import pdf_of_pages, word_document

QUESTION = "What is known about the Zorblax tidal turbines?"
NOTES = ("# Field notes\n\nThe Zorblax pilot array delivered 41 megawatt hours in its first tidal month. "
         "Divers found the Zorblax turbine blades free of fouling after ninety days.\n")


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, event: Any) -> None:
        self.events.append(event)


def shared(path: Path) -> FileRef:
    return FileRef(file_id=str(path), name=path.name, size=path.stat().st_size)


def research_with(corpus: Corpus, files: list[FileRef], **overrides: Any) -> tuple[Any, ResearchState, Recorder]:
    tools = corpus.tools()
    tools.files = LocalFiles()
    tools.file_limits = FileLimits(max_bytes=2 * 1024 * 1024, max_pdf_pages=20, max_files=5)
    state, recorder = ResearchState(), Recorder()
    report = asyncio.run(engine.research(QUESTION, options=options(**overrides), tools=tools, events=recorder,
                                         state=state, files=files))
    return report, state, recorder


def test_shared_files_are_cited_beside_the_web_with_their_pages(tmp_path: Path) -> None:
    notes = tmp_path / "field-notes.md"
    notes.write_text(NOTES)
    pdf = tmp_path / "survey.pdf"
    pdf.write_bytes(pdf_of_pages([["The Zorblax survey opens with its method."],
                                  ["On page two the Zorblax survey counts 17 turbines in the strait."]]))
    docx = tmp_path / "proposal.docx"
    docx.write_bytes(word_document(["The vendor proposal offers 12 Zorblax turbines at a fixed price."]))
    with Corpus() as corpus:
        report, state, _ = research_with(corpus, [shared(notes), shared(pdf), shared(docx)])

    assert report is not None and not report.partial
    files = {source.file.name: source for source in report.sources if source.file is not None}
    assert set(files) == {"field-notes.md", "survey.pdf", "proposal.docx"}
    web = [source for source in report.sources if source.file is None]
    assert web, "the web's sources are cited beside the files"
    assert files["survey.pdf"].file.kind == "pdf" and 2 in files["survey.pdf"].pages
    assert files["proposal.docx"].file.kind == "docx" and files["proposal.docx"].pages == []
    assert len(files["field-notes.md"].file.sha256) == 64 and files["field-notes.md"].file.size == len(NOTES)
    cited_from_files = {passage.source_id for passage in report.cited_passages} & {source.source_id for source in files.values()}
    assert cited_from_files == {source.source_id for source in files.values()}
    # The audit checks the files' citations like the web's: one at least for each source, every one supported.
    assert report.audit.citations_checked == report.audit.citations_supported >= len(files) + len(web)
    html = render_html(report)
    assert "survey.pdf (PDF, p" in html and "via file" not in html
    markdown = render_markdown(report)
    assert "survey.pdf (PDF, p. 2" in markdown or "survey.pdf (PDF, pp." in markdown
    assert all(source.provider == FILE_PROVIDER for source in files.values())
    assert set(state.files) == {source.source_id for source in files.values()}


def test_files_only_calls_no_search_provider(tmp_path: Path) -> None:
    notes = tmp_path / "field-notes.md"
    notes.write_text(NOTES)
    with Corpus() as corpus:
        report, _state, _ = research_with(corpus, [shared(notes)], files_only=True)
        searched = corpus.search.requests("brave")

    assert searched == []
    assert report is not None
    assert [source.file.name for source in report.sources if source.file] == ["field-notes.md"]
    assert all(source.file is not None for source in report.sources)


def test_a_file_that_cannot_be_read_is_named_and_the_run_goes_on(tmp_path: Path) -> None:
    notes = tmp_path / "field-notes.md"
    notes.write_text(NOTES)
    picture = tmp_path / "diagram.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(200))
    big = tmp_path / "huge.txt"
    big.write_text("Zorblax " * 400_000)
    with Corpus() as corpus:
        report, _state, recorder = research_with(corpus, [shared(picture), shared(big), shared(notes)], files_only=True)

    warnings = [event.message for event in recorder.events if event.type == "warning"]
    assert any(message.startswith("diagram.png was not used") for message in warnings)
    assert any(message.startswith("huge.txt was not used") and "MB limit" in message for message in warnings)
    assert report is not None and [source.file.name for source in report.sources if source.file] == ["field-notes.md"]
    assert any("diagram.png" in note for note in report.notes)
