"""What bench/engine.py relies on in the fakes: finish times on search requests, several pages per host, per-page latency."""

from __future__ import annotations

import httpx

from tests.fakes.corpus import HOSTS, Corpus
from tests.fakes.search_api import FakeSearchAPI


async def test_search_fake_records_when_each_reply_was_ready() -> None:
    fake = FakeSearchAPI(latency=0.05)
    async with fake.client() as client:
        response = await client.get(f"{fake.base_url('brave')}/res/v1/web/search", params={"q": "tides"},
                                    headers={"X-Subscription-Token": fake.api_keys["brave"]})
    assert response.status_code == 200
    recorded = fake.requests("brave")[0]
    assert recorded.finished_at is not None and recorded.finished_at - recorded.at >= 0.05


def test_corpus_serves_several_pages_per_host_each_with_its_own_facts() -> None:
    corpus = Corpus(pages_per_host=2)
    assert len(corpus.pages) == 2 * len(HOSTS)
    assert len({page.url for page in corpus.pages}) == len(corpus.pages)
    numbers = [number for page in corpus.pages for number in page.numbers]
    assert len(numbers) == len(set(numbers))


def test_corpus_has_one_page_per_host_by_default() -> None:
    assert [page.url.rsplit("/", 1)[-1] for page in Corpus().pages] == ["zorblax"] * len(HOSTS)


def test_corpus_page_latency_may_be_keyed_by_page_url_or_by_host() -> None:
    corpus = Corpus(pages_per_host=2, page_latency={"http://alpha.example/zorblax-2": 0.15, "alpha.example": 0.05})
    with corpus.web:
        with httpx.Client() as client:
            for path in ("/zorblax", "/zorblax-2"):
                response = client.get(f"http://127.0.0.1:{corpus.web.port}{path}", headers={"Host": "alpha.example"})
                assert response.status_code == 200
    durations = {request.path: (request.finished_at or 0.0) - request.at for request in corpus.web.requests.all()}
    assert durations["/zorblax"] >= 0.05
    assert durations["/zorblax-2"] >= 0.15
