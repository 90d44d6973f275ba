"""The journey of one /research from Slack to the report in its thread, hop by hop, as docs and the closing note name it.

A hop is a function that hands the request on to another object or module; the other methods of its object
(or, for a module's function, the module's private functions) are inside its hop. The list must stay short (at most 12), every hop must exist, and each must name the
next, so the list cannot drift from the code without this test failing.
"""

from __future__ import annotations

import importlib
import inspect

import pytest

JOURNEY = [
    ("bot/slack/app.py", "SlackListeners.on_command", "handle"),  # Slack's request as a ChatEvent, to the core
    ("bot/conversation/core.py", "ConversationCore.handle", "decide"),  # the view loaded, the rules asked
    ("bot/conversation/rules.py", "decide", "StartRun"),  # what the event means: a run to start
    ("bot/conversation/core.py", "ConversationCore.handle", "submit"),  # stored, status posted, submitted
    ("worker/queue.py", "Queue.submit", "send_task"),  # admitted, its task sent to Celery by name
    ("worker/tasks.py", "research_task", "run"),  # the Celery task, on one of the worker's threads
    ("worker/service.py", "WorkerRuntime.run", "RunAttempt"),  # the lease taken, the attempt's tools built
    ("worker/attempt.py", "RunAttempt.run_in_worker", "execute"),  # the engine on the runs loop, statuses across
    ("worker/attempt.py", "RunAttempt.execute", "research"),  # the engine for the mode; the outcome stored
    ("research/engine.py", "research", "_research"),  # plan, search, read, write, audit
    ("worker/attempt.py", "RunAttempt.run_in_worker", "finish"),  # back on the delivery loop, the report in memory
    ("worker/delivery.py", "RunDelivery.finish", "post"),  # the report posted in the thread, the status final
    ("chat/slack/messenger.py", "SlackMessenger.post", "chat_postMessage"),  # Slack's chat.postMessage
]
MAX_HOPS = 12


def resolve(path: str, qualified: str) -> object:
    module = importlib.import_module(path.removesuffix(".py").replace("/", "."))
    found: object = module
    for part in qualified.split("."):
        found = getattr(found, part)
    return found


def source_of(path: str, qualified: str) -> str:
    """The function's own source, with its object's other methods, or its module's private functions (the hop's)."""
    function = resolve(path, qualified)
    owner_name, _, _ = qualified.rpartition(".")
    if owner_name:
        members = vars(resolve(path, owner_name)).items()
    else:
        members = ((name, member) for name, member in vars(importlib.import_module(function.__module__)).items()
                   if name.startswith("_") and getattr(member, "__module__", None) == function.__module__)
    helpers = "".join(inspect.getsource(member) for _, member in members if inspect.isfunction(member))
    return inspect.getsource(function) + helpers  # type: ignore[arg-type]


def test_the_journey_takes_at_most_twelve_hops() -> None:
    hops = list(dict.fromkeys(f"{path}:{name}" for path, name, _ in JOURNEY))  # a hop named twice is one hop
    assert len(hops) <= MAX_HOPS, hops


@pytest.mark.parametrize(("path", "name", "next_name"), JOURNEY, ids=[f"{path}:{name}" for path, name, _ in JOURNEY])
def test_each_hop_exists_and_hands_on_to_the_next(path: str, name: str, next_name: str) -> None:
    assert callable(resolve(path, name))
    assert next_name in source_of(path, name)
