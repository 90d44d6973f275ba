"""deepthread's one error root: every error of ours is a `DeepthreadError`, and says in plain words what went wrong.

The person in the thread reads `error.plain_reason` (`research.engine.plain_reason` asks the error for it); each
kind that a person can act on words its own, and any other error, ours or not, reads as an internal error with the
gathered sources kept. Each class is defined where it is raised; this module only roots them. It lives in `research`,
the package that imports none of ours and that every other package may import (config, chat, bot and ops all do).

The tree (a test checks that it draws every subclass, under its own parent):

    DeepthreadError
     ├── LLMError                    research.llm: no usable answer from the language model
     │    ├── LLMUnavailable         unreachable, or 429/5xx after the retries
     │    │    └── LLMTimeout        no first token, silent mid-answer, or not done in time
     │    ├── ContextOverflow        the prompt does not fit the model's context window
     │    ├── LLMAuthError           the credentials were refused (401/403)
     │    └── StructuredOutputError  no valid JSON for the schema, even after a repair
     ├── SearchProviderError         research.providers.base: one provider call failed (kind, retry_after)
     ├── NoSearchProviderError       research.providers.router: no provider could answer
     ├── CpuTaskError                research.cpu: a pooled task ended without a result of its own
     │    ├── CpuTaskTimedOut        past the pool's time limit, its process killed
     │    └── CpuWorkerDied          its process died (killed, crashed, out of memory)
     ├── FetchStopped                research.fetch: a fetch ended early with a recorded outcome
     ├── FileRefused                 research.files: a shared file that cannot be a source (named, with why)
     ├── ResolutionError             research.netguard: a host name resolved to no address
     ├── MalformedHostError          research.netguard: a host no resolver reads the same way twice (a ValueError too)
     ├── MessengerError              chat.message: the platform refused a message after retries (reason, retryable)
     │    └── DiscordError           chat.discord.messenger: with Discord's HTTP status and error code
     ├── SettingsError               config.settings: a setting has an invalid value
     ├── HealthProblem               ops.health: a part answered and is not fit
     └── UsageProblem                bot.conversation.commands: the request cannot be run as written
"""

from __future__ import annotations


def internal_error_reason(error: BaseException) -> str:
    """What the thread reads about an error that has no plain words of its own: its type, and that nothing was lost."""
    return f"Internal error ({type(error).__name__}); the gathered sources were kept."


class DeepthreadError(Exception):
    """The root of every deepthread error; `plain_reason` is what a person in the thread should read about it."""

    @property
    def plain_reason(self) -> str:
        """What went wrong, in words a person in the thread can act on; never a traceback or a secret."""
        return internal_error_reason(self)
