"""Gathering overlaps its steps: the question is searched while decomposition runs, and a page is read as it arrives.

In-process fakes only: the model and the search API answer through their real wire formats in this event loop,
and the pages come from the fake web's transport, so each overlap is proved by one fake waiting on what the other did.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any

from research import engine
from research.budget import ResearchOptions
from research.engine import ResearchTools
from research.readers import extract_document
from research.fetch import FetchConfig
from research.llm import LLMClient, LLMConfig
from tests.fakes.llm import ChatRequest, FakeLLM, HandlerResult, decomposition, default_research_model
from tests.fakes.resolver import DictResolver
from tests.fakes.search_api import FakeSearchAPI
from tests.fakes.web import FakeWeb, Page, article_html

QUESTION = "How much energy did the Zorblax tidal turbines deliver?"
PLANNED_QUERY = "Zorblax turbine energy output"
ADDRESSES = {"question.example": ["93.184.216.34"], "plan.example": ["93.184.216.35"],
             "fast.example": ["93.184.216.36"], "slow.example": ["93.184.216.37"]}
# Long enough for the extractor to keep it as the page's main text.
FILLER = ("Engineers inspected the moorings, cables and monitoring equipment several times during the season, "
          "and the project team explained to visitors how tidal streams differ from waves.")


def page(host: str, number: str) -> str:
    return article_html(f"Zorblax report from {host}", [f"The Zorblax array on {host} delivered {number} kilowatt hours. "
                                                        + FILLER] * 3)


def hit(url: str) -> dict[str, Any]:
    return {"url": url, "title": f"Report at {url}", "snippet": "Zorblax turbines delivered energy."}


class Recorder:
    def __init__(self) -> None:
        self.events: list[Any] = []

    async def __call__(self, event: Any) -> None:
        self.events.append(event)

    def phases_started(self) -> list[str]:
        return [event.phase for event in self.events if event.type == "phase_started"]


def report_url(host: str) -> str:
    return f"https://{host}/report"


def site(pages: dict[str, str]) -> FakeWeb:
    """Each host's report page (`pages` by host) on the fake web."""
    return FakeWeb({report_url(host): Page(html) for host, html in pages.items()})


class InlinePool(Executor):
    """Runs CPU work at once, in the caller, and reports the URL of every page whose extraction starts."""

    def __init__(self, on_extraction: Callable[[str], None]) -> None:
        self.on_extraction = on_extraction

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        if getattr(fn, "func", None) is extract_document:
            self.on_extraction(fn.args[0])  # type: ignore[attr-defined]
        future: Future[Any] = Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as error:  # noqa: BLE001 - handed back to the awaiting coroutine
            future.set_exception(error)
        return future


def tools_for(model: FakeLLM, search: FakeSearchAPI, web: FakeWeb, *,
              cpu_pool: Executor | None = None) -> ResearchTools:
    return ResearchTools(
        llm=LLMClient(model.config(), http_client=model.http_client()),
        # Brave's one-call-a-second pacing is its plan's policy, not what these tests are about.
        search_config=search.search_config(providers=["brave"], min_interval_seconds={}),
        search_http=search.client(),
        resolver=DictResolver(ADDRESSES),
        fetch_config=FetchConfig(respect_robots=False, page_timeout_seconds=5.0),
        fetch_transport=web.transport(),
        cpu_pool=cpu_pool,
    )


def test_the_question_is_searched_while_decomposition_runs_and_its_results_join_the_first_round() -> None:
    async def main() -> tuple[Any, Recorder, engine.ResearchState, list[str], FakeLLM]:
        question_searched = asyncio.Event()
        searched: list[str] = []

        def results_for(provider: str, query: str) -> list[dict[str, Any]]:
            searched.append(query)
            if query == QUESTION:
                question_searched.set()
                return [hit("https://question.example/report")]
            return [hit("https://plan.example/report")]

        async def decomposing_after_the_question_search(request: ChatRequest) -> HandlerResult:
            if request.schema_name == "decomposition":
                # The plan is given only once the question's own search has reached the API: the two overlap.
                await asyncio.wait_for(question_searched.wait(), timeout=10)  # a hang guard, not a timing bound
                return decomposition([PLANNED_QUERY])(request)
            return default_research_model(request)

        model = FakeLLM(decomposing_after_the_question_search)
        web = site({"question.example": page("question.example", "4,411"), "plan.example": page("plan.example", "5,522")})
        tools = tools_for(model, FakeSearchAPI(results_for=results_for), web)
        recorder, state = Recorder(), engine.ResearchState()
        options = ResearchOptions(max_seconds=30, max_rounds=1, max_sources=4, max_searches=4)
        report = await engine.research(QUESTION, options=options, tools=tools, events=recorder, state=state)
        return report, recorder, state, searched, model

    report, recorder, state, searched, model = asyncio.run(main())

    assert not model.handler_errors
    assert report is not None and recorder.events[-1].type == "complete"
    assert searched == [QUESTION, PLANNED_QUERY]
    # One round: the question's result was fetched and read in it, listed first, beside the plan's.
    assert [state.sources[source_id].url for source_id in sorted(state.documents)] == [
        "https://question.example/report", "https://plan.example/report"]
    assert recorder.phases_started() == ["decompose", "search", "fetch", "read", "synthesize", "verify"]
    # No model call was added: one decomposition and one report (citations pass the lexical check).
    assert [request.schema_name for request in model.chat_requests] == ["decomposition", None]


def test_a_page_is_read_as_soon_as_it_arrives_while_slower_pages_are_still_being_fetched() -> None:
    async def main() -> tuple[Any, Recorder, engine.ResearchState, list[str]]:
        extracted: list[str] = []
        # The slow page answers only once the fast one is being read: reading waited for no round to end.
        web = site({"fast.example": page("fast.example", "6,633"), "slow.example": page("slow.example", "7,744")})
        web.hold(report_url("slow.example"))

        def on_extraction(url: str) -> None:
            extracted.append(url)
            if "fast.example" in url:
                web.release(report_url("slow.example"))

        def results_for(provider: str, query: str) -> list[dict[str, Any]]:
            return [hit("https://fast.example/report"), hit("https://slow.example/report")]

        model = FakeLLM(lambda request: decomposition([PLANNED_QUERY])(request) if request.schema_name == "decomposition"
                        else default_research_model(request))
        tools = tools_for(model, FakeSearchAPI(results_for=results_for), web, cpu_pool=InlinePool(on_extraction))
        recorder, state = Recorder(), engine.ResearchState()
        options = ResearchOptions(max_seconds=30, max_rounds=1, max_sources=4, max_searches=1)
        report = await engine.research(QUESTION, options=options, tools=tools, events=recorder, state=state)
        return report, recorder, state, extracted

    report, recorder, state, extracted = asyncio.run(main())

    assert report is not None and recorder.events[-1].type == "complete"
    assert [state.fetches[source_id].status for source_id in sorted(state.fetches)] == ["ok", "ok"]
    assert extracted == ["https://fast.example/report", "https://slow.example/report"]
    assert sorted(state.documents) == ["s1", "s2"]
    assert recorder.phases_started() == ["decompose", "search", "fetch", "read", "synthesize", "verify"]
    # The read phase still closes the round: its passages are numbered in source order, fast page first.
    assert [passage.source_id for passage in state.passages][:1] == ["s1"]


def test_the_questions_pages_are_fetched_and_read_while_decomposition_runs_and_only_once() -> None:
    """The plan is given only once the page the question's own search found has been fetched and is being read:
    the pages of the first search to answer do not wait for the model's plan. The first round then fetches only
    the plan's page; the question's is not fetched again, and no model call is added."""
    async def main() -> tuple[Any, Recorder, engine.ResearchState, FakeLLM, FakeWeb]:
        question_page_read = asyncio.Event()

        def results_for(provider: str, query: str) -> list[dict[str, Any]]:
            return [hit("https://question.example/report")] if query == QUESTION else [hit("https://plan.example/report")]

        def on_extraction(url: str) -> None:
            if "question.example" in url:
                question_page_read.set()

        async def decomposing_after_the_questions_page(request: ChatRequest) -> HandlerResult:
            if request.schema_name == "decomposition":
                await asyncio.wait_for(question_page_read.wait(), timeout=10)  # a hang guard, not a timing bound
                return decomposition([PLANNED_QUERY])(request)
            return default_research_model(request)

        model = FakeLLM(decomposing_after_the_questions_page)
        web = site({"question.example": page("question.example", "4,411"), "plan.example": page("plan.example", "5,522")})
        tools = tools_for(model, FakeSearchAPI(results_for=results_for), web, cpu_pool=InlinePool(on_extraction))
        recorder, state = Recorder(), engine.ResearchState()
        options = ResearchOptions(max_seconds=30, max_rounds=1, max_sources=4, max_searches=4)
        report = await engine.research(QUESTION, options=options, tools=tools, events=recorder, state=state)
        return report, recorder, state, model, web

    report, recorder, state, model, web = asyncio.run(main())

    assert not model.handler_errors
    assert report is not None and recorder.events[-1].type == "complete"
    assert [state.sources[source_id].url for source_id in sorted(state.documents)] == [
        "https://question.example/report", "https://plan.example/report"]
    fetched = [request.host for request in web.requests.all() if request.path == "/report"]
    assert sorted(fetched) == ["plan.example", "question.example"]
    assert [request.schema_name for request in model.chat_requests] == ["decomposition", None]


def second_round_world(gap_answer: Callable[[ChatRequest], Any], synthesis: Callable[[ChatRequest], Any]):
    """The question and the plan's query each find one page; the gap check may ask for a third query's page."""
    def results_for(provider: str, query: str) -> list[dict[str, Any]]:
        if query == QUESTION:
            return [hit("https://question.example/report")]
        if query == "Zorblax output second season":
            return [hit("https://fast.example/report")]
        return [hit("https://plan.example/report")]

    async def model(request: ChatRequest) -> HandlerResult:
        if request.schema_name == "decomposition":
            return decomposition([PLANNED_QUERY])(request)
        if request.schema_name == "gap_check":
            return await gap_answer(request)
        if request.schema_name is None:
            return await synthesis(request)
        return default_research_model(request)

    web = site({"question.example": page("question.example", "4,411"), "plan.example": page("plan.example", "5,522"),
                "fast.example": page("fast.example", "6,633")})
    return FakeSearchAPI(results_for=results_for), model, web


def test_the_report_is_written_while_the_gap_check_runs_and_kept_when_it_finds_no_gap() -> None:
    """The gap check answers only once the report's model call has begun: the two overlap, and the report written
    beside it is the one delivered, with no model call added (decomposition, gap check, report)."""
    async def main() -> tuple[Any, Recorder, FakeLLM]:
        report_begun = asyncio.Event()

        async def covered_once_the_report_is_begun(request: ChatRequest) -> Any:
            await asyncio.wait_for(report_begun.wait(), timeout=10)  # a hang guard, not a timing bound
            return {"covered": True, "sub_questions": [], "more_queries": []}

        async def report(request: ChatRequest) -> Any:
            report_begun.set()
            return default_research_model(request)

        search, handler, web = second_round_world(covered_once_the_report_is_begun, report)
        model = FakeLLM(handler)
        recorder = Recorder()
        options = ResearchOptions(max_seconds=30, max_rounds=2, max_sources=4, max_searches=4)
        result = await engine.research(QUESTION, options=options, tools=tools_for(model, search, web), events=recorder)
        return result, recorder, model

    report, recorder, model = asyncio.run(main())

    assert not model.handler_errors
    assert report is not None and recorder.events[-1].type == "complete" and not report.partial
    assert report.audit.sentences_verified > 0
    assert [request.schema_name for request in model.chat_requests] == ["decomposition", "gap_check", None]
    assert recorder.phases_started() == ["decompose", "search", "fetch", "read", "gap_check", "synthesize", "verify"]


def test_a_report_written_beside_a_gap_check_that_finds_a_gap_is_dropped_and_written_again() -> None:
    """The gap check asks for one more query; the report begun beside it is stopped (it never answers), the second
    round reads the new page, and the report delivered is written after it, from all three pages."""
    async def main() -> tuple[Any, Recorder, FakeLLM, list[str]]:
        reports_begun: list[str] = []
        first_report_begun = asyncio.Event()

        async def one_more_query(request: ChatRequest) -> Any:
            await asyncio.wait_for(first_report_begun.wait(), timeout=10)  # a hang guard, not a timing bound
            return {"covered": False, "sub_questions": [], "more_queries": ["Zorblax output second season"]}

        async def report(request: ChatRequest) -> Any:
            reports_begun.append("fast.example" if "fast.example" in request.text else "first round")
            first_report_begun.set()
            if len(reports_begun) == 1:
                await asyncio.Event().wait()  # the first is never answered: only a drop ends it
            return default_research_model(request)

        search, handler, web = second_round_world(one_more_query, report)
        model = FakeLLM(handler)
        recorder = Recorder()
        options = ResearchOptions(max_seconds=30, max_rounds=2, max_sources=4, max_searches=4)
        result = await engine.research(QUESTION, options=options, tools=tools_for(model, search, web), events=recorder)
        return result, recorder, model, reports_begun

    report, recorder, model, reports_begun = asyncio.run(main())

    assert not model.handler_errors
    assert report is not None and recorder.events[-1].type == "complete" and not report.partial
    assert reports_begun == ["first round", "fast.example"]
    assert recorder.phases_started() == ["decompose", "search", "fetch", "read", "gap_check", "search", "fetch",
                                         "read", "synthesize", "verify"]
    assert "fast.example" in {source.url.split("/")[2] for source in report.sources}


def test_an_endpoint_that_answers_one_call_at_a_time_gets_the_report_after_the_gap_check() -> None:
    """A local server (here: LLM_PARALLEL_REQUESTS=false) is never sent the report while the gap check waits on it."""
    async def main() -> tuple[Any, FakeLLM, list[str]]:
        calls_in_flight: list[str] = []
        gap_checked = asyncio.Event()

        async def covered(request: ChatRequest) -> Any:
            await asyncio.sleep(0.05)  # long enough for a report sent alongside to have arrived
            gap_checked.set()
            return {"covered": True, "sub_questions": [], "more_queries": []}

        async def report(request: ChatRequest) -> Any:
            calls_in_flight.append("report after the gap check" if gap_checked.is_set() else "report beside it")
            return default_research_model(request)

        search, handler, web = second_round_world(covered, report)
        model = FakeLLM(handler)
        tools = tools_for(model, search, web)
        tools.llm = LLMClient(model.config(parallel_requests=False), http_client=model.http_client())
        options = ResearchOptions(max_seconds=30, max_rounds=2, max_sources=4, max_searches=4)
        result = await engine.research(QUESTION, options=options, tools=tools, events=Recorder())
        return result, model, calls_in_flight

    report, model, calls_in_flight = asyncio.run(main())

    assert not model.handler_errors
    assert report is not None
    assert calls_in_flight == ["report after the gap check"]


def test_an_endpoint_is_taken_to_answer_in_parallel_unless_it_is_local_or_said_otherwise() -> None:
    def parallel(base_url: str, **setting: Any) -> bool:
        return LLMConfig(base_url=base_url, model="m", **setting).serves_in_parallel()

    assert parallel("https://api.openai.com/v1") and parallel("https://openrouter.ai/api/v1")
    assert not parallel("http://127.0.0.1:8080/v1") and not parallel("http://localhost:11434/v1")
    assert not parallel("http://192.168.1.20:8000/v1") and not parallel("http://[::1]:8000/v1")
    assert parallel("http://127.0.0.1:8000/v1", parallel_requests=True)
    assert not parallel("https://api.openai.com/v1", parallel_requests=False)


def test_a_sub_query_s_pages_are_fetched_and_read_while_a_slower_sub_query_still_searches() -> None:
    """The second sub-query's search answers only once the first one's page is being read: a round's pages are
    fetched as each search answers, not after the slowest."""
    async def main() -> tuple[Any, Recorder, engine.ResearchState, list[str]]:
        extracted: list[str] = []
        search = FakeSearchAPI(results_for=lambda provider, query: [
            hit("https://fast.example/report") if "output" in query else hit("https://slow.example/report")])
        slow_search = search.hold("maintenance")

        def on_extraction(url: str) -> None:
            extracted.append(url)
            if "fast.example" in url:
                slow_search.set()

        model = FakeLLM(lambda request: decomposition([PLANNED_QUERY, "Zorblax turbine maintenance"])(request)
                        if request.schema_name == "decomposition" else default_research_model(request))
        web = site({"fast.example": page("fast.example", "6,633"), "slow.example": page("slow.example", "7,744")})
        tools = tools_for(model, search, web, cpu_pool=InlinePool(on_extraction))
        recorder, state = Recorder(), engine.ResearchState()
        # A plan given: the question itself is not searched, only the plan's two queries.
        options = ResearchOptions(max_seconds=30, max_rounds=1, max_sources=4, max_searches=2)
        async with asyncio.timeout(20):  # a hang guard: without the overlap the slow search never answers
            report = await engine.research(QUESTION, options=options, tools=tools, events=recorder, state=state,
                                           plan={"sub_questions": [
                                               {"question": "Output?", "queries": [PLANNED_QUERY]},
                                               {"question": "Upkeep?", "queries": ["Zorblax turbine maintenance"]}]})
        return report, recorder, state, extracted

    report, recorder, state, extracted = asyncio.run(main())

    assert report is not None and recorder.events[-1].type == "complete"
    assert extracted == ["https://fast.example/report", "https://slow.example/report"]
    # Ids still follow the queries' order, whatever answered first.
    assert [state.sources[source_id].url for source_id in sorted(state.documents)] == [
        "https://fast.example/report", "https://slow.example/report"]
    assert recorder.phases_started() == ["decompose", "search", "fetch", "read", "synthesize", "verify"]


def test_an_address_the_question_names_is_fetched_before_what_the_searches_find() -> None:
    async def main() -> engine.ResearchState:
        search = FakeSearchAPI(results_for=lambda provider, query: [hit("https://fast.example/report")])
        model = FakeLLM(lambda request: decomposition([PLANNED_QUERY])(request)
                        if request.schema_name == "decomposition" else default_research_model(request))
        web = site({"fast.example": page("fast.example", "6,633"), "slow.example": page("slow.example", "7,744")})
        tools = tools_for(model, search, web)
        state = engine.ResearchState()
        # A follow-on question (with the thread as context, so the question itself is not searched), one source.
        options = ResearchOptions(max_seconds=30, max_rounds=1, max_sources=1, max_searches=2)
        await engine.research(f"What does {report_url('slow.example')} say about the Zorblax turbines?",
                              context="Earlier: a report on tidal power.", options=options, tools=tools,
                              events=Recorder(), state=state)
        return state

    state = asyncio.run(main())
    assert [state.sources[source_id].url for source_id in state.fetches] == ["https://slow.example/report"]
