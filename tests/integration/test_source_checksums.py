"""Each page a run read is stored with the SHA-256 of the whole text extracted from it (a watch's next run compares
it): the same text gives the same checksum whatever the question ranks first, and a changed text another one.
Research runs through the worker's runner against the fake web, search provider and model, stored on SQLite."""

from __future__ import annotations

import asyncio
import hashlib
import itertools

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from research.extract import extract_document
from storage.models import Source
from tests.attempts import admitted_run, execute_stored
from tests.fakes.corpus import FILLER, QUESTION, Corpus, CorpusPage, options
from tests.fakes.web import Page, article_html
from worker.runner import RunnerServices

pytestmark = pytest.mark.integration

_threads = itertools.count(1)
CHANGED_URL = "http://alpha.example/zorblax"
MISSING_URL = "http://beta.example/gone"  # found by the search, never served: the run sees its snippet only
OTHER_QUESTION = "Which coastal sites did the Zorblax engineers inspect, and who was invited to the open days?"


def researched(sessions: sessionmaker[Session], corpus: Corpus, question: str) -> dict[str, str | None]:
    """Run `question` through the worker's runner to its end; the stored sources' checksums by URL."""
    run_id = admitted_run(sessions, question=question, thread=f"{next(_threads)}.0")
    every_result = options(max_rounds=1, max_sources=10, results_per_query=10)
    services = RunnerServices(sessions=sessions, tools=corpus.tools(), options=every_result)
    final = asyncio.run(execute_stored(run_id, services))
    assert final is not None and final.state == "done"
    with sessions() as session:
        return dict(session.execute(select(Source.url, Source.checksum).where(Source.run_id == run_id)).all())


def serve(corpus: Corpus, url: str, paragraphs: list[str]) -> str:
    """Serve an article at `url` (without the port); the SHA-256 of the text extraction gets from it."""
    html = article_html("Zorblax turbines report from Alpha", paragraphs, site_name="alpha.example")
    corpus.web.add(url, Page(html))
    document = extract_document(corpus.web.url(url), html.encode(), "text/html; charset=utf-8")
    assert document is not None
    return hashlib.sha256(document.text.encode()).hexdigest()


def test_a_read_page_s_checksum_is_of_its_extracted_text_and_moves_only_when_the_text_does(
        file_sessions: sessionmaker[Session]) -> None:
    facts = [f"The Zorblax turbine array number 1{index} delivered {1_011 + index * 37:,} kilowatt hours during its "
             f"measured trial period. {FILLER}" for index in range(4)]
    with Corpus() as corpus:
        expected = serve(corpus, CHANGED_URL, facts)
        changed_url, missing_url = corpus.web.url(CHANGED_URL), corpus.web.url(MISSING_URL)
        corpus.pages.append(CorpusPage(url=missing_url, title="Gone", facts=["A page that is no longer served."],
                                       numbers=[]))

        first = researched(file_sessions, corpus, QUESTION)
        ranked_otherwise = researched(file_sessions, corpus, OTHER_QUESTION)
        moved = serve(corpus, CHANGED_URL, [facts[0].replace("1,011", "1,250"), *facts[1:]])
        after_the_change = researched(file_sessions, corpus, QUESTION)

    assert first[changed_url] == expected
    assert missing_url in first and first[missing_url] is None
    read = {url: checksum for url, checksum in first.items() if checksum is not None}
    assert set(read) == {page.url for page in corpus.pages} - {missing_url}, "every page served is read"
    assert all(len(checksum) == 64 for checksum in read.values())
    assert ranked_otherwise == first
    assert after_the_change[changed_url] == moved != expected
    assert {url: checksum for url, checksum in after_the_change.items() if url != changed_url} == {
        url: checksum for url, checksum in first.items() if url != changed_url}
