# No "# syntax=" line: BuildKit's built-in frontend has everything used here (RUN --mount),
# and a named frontend would be fetched from Docker Hub, failing offline and mirrored builds.
# Build stage: resolve and install the locked dependencies into a virtual environment.
FROM python:3.11-slim-bookworm AS build
# the uv series that wrote uv.lock (lock revision 5); an older uv may refuse it under --locked
COPY --from=ghcr.io/astral-sh/uv:0.13 /uv /usr/local/bin/uv
ENV UV_COMPILE_BYTECODE=1 UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never
WORKDIR /srv
COPY pyproject.toml uv.lock README.md ./
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev --no-install-project
COPY agent_runtime ./agent_runtime
COPY app ./app
RUN --mount=type=cache,target=/root/.cache/uv uv sync --locked --no-dev

# Runtime stage: the environment and the code, owned by root and only readable by the
# unprivileged user (uid/gid 999) that runs them; only ./var/ (the SQLite default) is its own.
FROM python:3.11-slim-bookworm
RUN groupadd --system --gid 999 agent \
    && useradd --system --uid 999 --gid 999 --home /srv --no-create-home agent \
    && mkdir -p /srv/var && chown 999:999 /srv/var
WORKDIR /srv
COPY --from=build /srv /srv
# JSON logs even under `docker run -t`, where a terminal would make them text for people
ENV PATH="/srv/.venv/bin:$PATH" PYTHONUNBUFFERED=1 AGENT_LOG_FORMAT=json
# numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd
USER 999:999
EXPOSE 8000
# readiness, not liveness: a draining or warming worker reports unhealthy and gets no traffic
HEALTHCHECK --interval=10s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request,sys; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2).status != 200)"]
# SIGTERM starts the drain; give it AGENT_DRAIN_TIMEOUT + 10 s (cancelled runs write their end)
# plus a margin (docker stop -t, compose stop_grace_period, terminationGracePeriodSeconds)
STOPSIGNAL SIGTERM
# No init process of its own: run it with one that reaps the stdio MCP servers' processes
# (compose.yaml: init: true; docker run --init; Kubernetes: see docs/deploy.md)
CMD ["agent-server", "--host", "0.0.0.0", "--port", "8000"]
