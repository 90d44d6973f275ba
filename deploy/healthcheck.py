#!/usr/bin/env python3
"""The container health probe: exit 0 when http://127.0.0.1:PORT/healthz answers 200, 1 otherwise.

The port is the first argument, else HEALTH_PORT, else WORKER_HTTP_PORT, else the worker's 9450;
port 0 means the process serves no health endpoint, so there is nothing to check. Standard library
only, and deliberately not urllib: a proxy set in the environment must not carry a loopback probe.
"""

from __future__ import annotations

import http.client
import os
import sys
from collections.abc import Mapping, Sequence

DEFAULT_PORT = 9450
TIMEOUT_SECONDS = 4.0
# Docker keeps the probe's output in `docker inspect`; the start of a 503 body names the failing part.
REASON_CHARACTERS = 200


def health_port(arguments: Sequence[str], environment: Mapping[str, str]) -> int:
    """The port to probe: the first argument, else HEALTH_PORT, else WORKER_HTTP_PORT, else 9450."""
    argument = arguments[0] if arguments else ""
    chosen = argument or environment.get("HEALTH_PORT") or environment.get("WORKER_HTTP_PORT")
    return int(chosen) if chosen else DEFAULT_PORT


def probe(port: int, *, host: str = "127.0.0.1", timeout: float = TIMEOUT_SECONDS) -> str | None:
    """None when GET /healthz on the port answers 200, otherwise why it did not."""
    connection = http.client.HTTPConnection(host, port, timeout=timeout)
    try:
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        if response.status == 200:
            return None
        body = response.read(REASON_CHARACTERS).decode("utf-8", "replace").strip()
        return f"/healthz answered {response.status}: {body}" if body else f"/healthz answered {response.status}"
    except (OSError, http.client.HTTPException) as error:
        return f"/healthz on port {port} unreachable: {error.__class__.__name__}: {error}"
    finally:
        connection.close()


def main(arguments: Sequence[str] = (), environment: Mapping[str, str] = os.environ) -> int:
    """Probe the port and return the exit status, printing the reason for a failure."""
    port = health_port(arguments, environment)
    if port == 0:
        print("health endpoint disabled (port 0): nothing to check")
        return 0
    problem = probe(port)
    if problem:
        print(problem, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
