# syntax=docker/dockerfile:1
# The declop image: `declop run` on python:3.11-slim, as numeric non-root user 65532.
#
#   docker build -t declop:0.1.0 --build-arg VERSION=0.1.0 .
#
# Release builds pin the base image by digest:
#   --build-arg PYTHON_IMAGE=python:3.11-slim@sha256:<digest>
# Your operator's image starts FROM this one (docs/deploy.md); the Helm chart runs either.
ARG PYTHON_IMAGE=python:3.11-slim

# ---- builder: a wheel from the source tree, installed with the `fast` extra into a venv ----
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml setup.cfg README.md ./
COPY declop/ declop/
RUN python -m pip wheel --no-deps --wheel-dir /wheels . \
 && python -m venv /opt/declop \
 && set -- /wheels/declop-*.whl \
 && /opt/declop/bin/pip install "$1[fast]" \
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
# Exec form: declop is PID 1 and receives SIGTERM itself (it drains, then exits 0).
# Handlers come from arguments or DECLOP_PATHS / DECLOP_MODULES (the chart sets these).
ENTRYPOINT ["declop", "run"]
