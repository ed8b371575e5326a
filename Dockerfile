# syntax=docker/dockerfile:1
# The declop image: `declop run` under tini on python:3.11-slim-bookworm, as non-root user 65532.
#
#   docker build -t declop:0.1.0 --build-arg VERSION=0.1.0 .
#
# Supply chain (docs/deploy.md, "Security"):
# - the base is pinned by digest, its tag beside it; `make pin-base` moves the digest to what the
#   tag points at now (tools/pin-base.sh, Docker Hub's registry API);
# - Python packages come only from requirements/image.lock and requirements/build.lock
#   (`make lock`: uv, versions and sha256 hashes), installed with --require-hashes --no-deps;
# - PID 1 is Debian's tini: it forwards signals to declop and reaps orphaned handler children.
# Without network (the test kit, `make image`): the base, the `wheels` stage and the `tini` stage
# come as named contexts, e.g. `--build-context wheels=<folder of wheels>` (declop.testing.cluster.image).
# Your operator's image starts FROM this one (docs/deploy.md); the Helm chart runs either.
#
# Where the digest below came from (`make pin-base` rewrites this line):
# base-digest-source: public Dockerfiles pinning it in 2026, by code search (no registry reachable)
ARG PYTHON_IMAGE=python:3.11-slim-bookworm@sha256:528257d48c1da0dcecc2e725d1ae34498d60c965f1241e39cd6a85a8859bdf84

# ---- wheels: exactly the wheels the lock files name, checked against their hashes; a named
# context `wheels` (a folder of wheels) replaces this stage ----
FROM ${PYTHON_IMAGE} AS wheel-download
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY requirements/ /requirements/
RUN python3 -m venv /tmp/venv \
 && /tmp/venv/bin/pip download --dest /wheels --require-hashes --no-deps --only-binary=:all: \
      -r /requirements/image.lock -r /requirements/build.lock

FROM scratch AS wheels
COPY --from=wheel-download /wheels/ /

# ---- tini: Debian's, static; a named context `tini` (an image or folder holding
# /usr/bin/tini-static) replaces this stage ----
FROM ${PYTHON_IMAGE} AS tini
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/*

# ---- builder: declop's wheel built from the source tree by the locked build backend, then the
# locked dependencies and that wheel installed into a venv, from the wheels only: no network ----
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY requirements/ requirements/
COPY pyproject.toml setup.cfg README.md ./
COPY declop/ declop/
RUN --network=none --mount=type=bind,from=wheels,target=/wheels \
    python3 -m venv /tmp/build \
 && /tmp/build/bin/pip install --no-index --find-links /wheels --require-hashes --no-deps \
      -r requirements/build.lock \
 && /tmp/build/bin/pip wheel --no-index --no-build-isolation --no-deps --wheel-dir /tmp/dist . \
 && python3 -m venv /opt/declop \
 && /opt/declop/bin/pip install --no-index --find-links /wheels --require-hashes --no-deps \
      -r requirements/image.lock \
 && set -- /tmp/dist/declop-*.whl \
 && /opt/declop/bin/pip install --no-index --no-deps "$1" \
 && /opt/declop/bin/pip check \
 && /opt/declop/bin/declop --version

# ---- runtime: the venv only; no compiler, no build files, nothing installed at start-up ----
FROM ${PYTHON_IMAGE}
ARG PYTHON_IMAGE
ARG VERSION=0.1.0
ARG SOURCE_URL=""
LABEL org.opencontainers.image.title="declop" \
      org.opencontainers.image.description="Level-triggered Kubernetes operators in plain Python: declop run" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
COPY --from=builder /opt/declop /opt/declop
COPY --from=tini /usr/bin/tini-static /usr/bin/tini
# Unbuffered: a log line is out before a crash. No bytecode writes: handlers may sit on a
# read-only ConfigMap volume. HOME=/tmp: the root filesystem is read-only in the chart and
# /tmp is its emptyDir; user 65532 has no passwd entry or home directory.
ENV PATH=/opt/declop/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp
WORKDIR /app
# Numeric, so that runAsNonRoot can verify it without a passwd lookup.
USER 65532:65532
# 8080: GET /metrics (--metrics-port); 8081: GET /healthz, /readyz (--health-port).
EXPOSE 8080 8081
# tini is PID 1: it forwards SIGTERM (and every other signal) to declop, which drains and exits 0,
# exits with declop's exit code, and reaps the zombies a handler's orphaned children leave.
# Arguments after the image (the chart's `args`, `docker run IMAGE <paths>`) go to `declop run`;
# handlers come from them or DECLOP_PATHS / DECLOP_MODULES (the chart sets these).
ENTRYPOINT ["tini", "--", "declop", "run"]
