"""Resolvers for tests: names answer from a dict, so no test ever asks real DNS."""

from __future__ import annotations

from collections.abc import Sequence

from research.netguard import ResolutionError


class DictResolver:
    """Answers each name from a fixed mapping and records every lookup; unknown names fail like a failed lookup."""

    def __init__(self, mapping: dict[str, list[str]]) -> None:
        self.mapping = {name.lower(): list(addresses) for name, addresses in mapping.items()}
        self.lookups: list[str] = []

    async def resolve(self, host: str) -> list[str]:
        """Return the addresses mapped to `host`; raises ResolutionError for a name not in the mapping."""
        self.lookups.append(host)
        try:
            return list(self.mapping[host.lower()])
        except KeyError:
            raise ResolutionError(f"could not resolve {host}: name not known") from None


class RebindingResolver:
    """Gives a different answer on each lookup of a name (the last answer repeats), as a DNS-rebinding attacker would."""

    def __init__(self, answers: dict[str, Sequence[list[str]]]) -> None:
        self.answers = {name.lower(): list(sequence) for name, sequence in answers.items()}
        self.lookups: list[str] = []

    async def resolve(self, host: str) -> list[str]:
        """Return the next answer for `host`; raises ResolutionError for a name not configured."""
        name = host.lower()
        if name not in self.answers:
            raise ResolutionError(f"could not resolve {host}: name not known")
        served = sum(1 for looked_up in self.lookups if looked_up == name)
        self.lookups.append(name)
        sequence = self.answers[name]
        return list(sequence[min(served, len(sequence) - 1)])
