FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc make libc6-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
COPY pyproject.toml README.md ./
COPY bot ./bot
COPY worker ./worker
COPY research ./research
COPY storage ./storage
COPY config ./config
RUN pip install .

RUN useradd --create-home deepthread && mkdir -p /app/data && chown deepthread /app/data
USER deepthread
CMD ["deepthread", "--help"]
