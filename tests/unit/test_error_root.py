"""Every deepthread error has one root, the tree drawn in its module matches the classes, and the thread's words stay."""

from __future__ import annotations

import pytest

from bot.conversation.commands import UsageProblem
from chat.discord.messenger import DiscordError
from chat.message import MessengerError
from config.settings import SettingsError
from ops.health import HealthProblem
from research import errors
from research.cpu import CpuTaskError, CpuTaskTimedOut, CpuWorkerDied
from research.engine import plain_reason
from research.errors import DeepthreadError
from research.fetch import FetchStopped
from research.files import FileRefused
from research.llm import ContextOverflow, LLMAuthError, LLMError, LLMTimeout, LLMUnavailable, StructuredOutputError
from research.netguard import MalformedHostError, ResolutionError
from research.providers.base import SearchProviderError
from research.providers.router import NoSearchProviderError

OUR_PACKAGES = {"research", "chat", "config", "ops", "bot", "worker", "storage"}
ERRORS = [
    LLMError, LLMUnavailable, LLMTimeout, ContextOverflow, LLMAuthError, StructuredOutputError, SearchProviderError,
    NoSearchProviderError, CpuTaskError, CpuTaskTimedOut, CpuWorkerDied, FetchStopped, ResolutionError,
    MalformedHostError, MessengerError, DiscordError, UsageProblem, SettingsError, HealthProblem, FileRefused,
]


def drawn_tree() -> dict[str, str]:
    """Each class drawn in the errors module's docstring, with the class drawn as its parent."""
    parents: dict[str, str] = {}
    path: list[tuple[int, str]] = [(-1, "DeepthreadError")]
    for line in (errors.__doc__ or "").splitlines():
        branch = line.find("── ")
        if branch < 0:
            continue
        name = line[branch + len("── "):].split()[0]
        while path[-1][0] >= branch:
            path.pop()
        parents[name] = path[-1][1]
        path.append((branch, name))
    return parents


def defined_tree() -> dict[str, str]:
    """Each subclass of the root defined in deepthread's packages (not in tests), with its parent in the tree."""
    parents: dict[str, str] = {}

    def walk(parent: type[DeepthreadError]) -> None:
        for child in parent.__subclasses__():
            if child.__module__.split(".")[0] in OUR_PACKAGES:
                parents[child.__name__] = next(base.__name__ for base in child.__bases__
                                               if issubclass(base, DeepthreadError))
                walk(child)

    walk(DeepthreadError)
    return parents


@pytest.mark.parametrize("error", ERRORS, ids=lambda error: error.__name__)
def test_every_error_of_ours_is_a_deepthread_error(error: type[Exception]) -> None:
    assert issubclass(error, DeepthreadError)


def test_a_malformed_host_is_still_a_value_error() -> None:
    assert issubclass(MalformedHostError, ValueError)


def test_the_docstring_draws_every_error_under_its_own_parent() -> None:
    drawn = drawn_tree()
    assert {name: drawn.get(name) for name in defined_tree()} == defined_tree()


def test_the_docstring_draws_no_error_that_does_not_exist() -> None:
    assert set(drawn_tree()) - set(defined_tree()) == set()


@pytest.mark.parametrize(("error", "reason"), [
    (LLMAuthError("HTTP 401", status=401), "The language model refused our credentials (check LLM_API_KEY)."),
    (LLMTimeout("no first token within 60 s", limit="LLM_FIRST_TOKEN_TIMEOUT"),
     "The language model was too slow: no first token within 60 s."),
    (ContextOverflow("9,000 tokens over an 8,192-token window", context_tokens=8192),
     "The request is too long for the language model: 9,000 tokens over an 8,192-token window (LLM_CONTEXT_TOKENS)."),
    (LLMUnavailable("HTTP 503 after 3 tries", status=503), "The language model could not be reached: HTTP 503 after 3 tries"),
    (StructuredOutputError("not valid JSON", task="decompose", last_answer="{"),
     "The language model did not return a valid answer: not valid JSON"),
    (LLMError("the model returned an empty answer"), "The language model failed: the model returned an empty answer"),
    (NoSearchProviderError("tavily: rate limited"), "No search provider could answer (tavily: rate limited)."),
    (NoSearchProviderError(), "No search provider could answer."),
    (NoSearchProviderError("tavily: not configured; brave: not configured", unset=["TAVILY_API_KEY", "BRAVE_API_KEY"]),
     "No search provider could answer (tavily: not configured; brave: not configured). Set TAVILY_API_KEY or "
     "BRAVE_API_KEY in .env, or SEARCH_PROVIDERS=auto to search DuckDuckGo, which needs no key."),
    (SearchProviderError("brave", "server", status=502),
     "Internal error (SearchProviderError); the gathered sources were kept."),
    (CpuWorkerDied("killed"), "Internal error (CpuWorkerDied); the gathered sources were kept."),
    (FetchStopped("refused", "body over 10 MiB cap"), "Internal error (FetchStopped); the gathered sources were kept."),
    (MessengerError("ratelimited", retryable=True), "Internal error (MessengerError); the gathered sources were kept."),
    (ValueError("not ours"), "Internal error (ValueError); the gathered sources were kept."),
    (KeyError("not ours either"), "Internal error (KeyError); the gathered sources were kept."),
], ids=lambda value: type(value).__name__ if isinstance(value, BaseException) else "")
def test_the_thread_reads_the_same_plain_reason_for_each_kind_of_error(error: BaseException, reason: str) -> None:
    assert plain_reason(error) == reason
    if isinstance(error, DeepthreadError):
        assert error.plain_reason == reason
