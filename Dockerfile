# syntax=docker/dockerfile:1
# One image, two entry points:  `frscope operator`  and  `frscope sidecar`  (charts/frscope uses both).
#
#   docker build -t frscope:0.1.0 .
#   docker run --rm frscope:0.1.0 --help
#
# Stage 1 builds a virtual environment from wheels (every dependency ships wheels for amd64 and arm64,
# so no compiler is needed anywhere); stage 2 copies only that environment onto a clean slim base. torch
# is not a dependency: the sidecar talks to the trainer's worker server over a unix socket.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ONLY_BINARY=:all:
RUN python -m venv /opt/frscope
WORKDIR /src
# Dependencies first (a layer that survives source changes), then the package itself.
# setup.py only declares the optional C scanner: the slim image has no compiler, so the build skips it with a
# warning and frscope reads dumps with its pure-Python path (frscope/records/scan.py).
COPY pyproject.toml setup.py README.md LICENSE ./
COPY frscope ./frscope
RUN /opt/frscope/bin/pip install . \
    && /opt/frscope/bin/pip uninstall --yes pip setuptools \
    && /opt/frscope/bin/python -m compileall -q /opt/frscope/lib \
    && /opt/frscope/bin/frscope --version

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="frscope" \
      org.opencontainers.image.description="Diagnoses hung PyTorch distributed jobs from the Flight Recorder" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/frscope/frscope"
# A numeric, non-root user (the chart runs as 65532 with runAsNonRoot, which needs a numeric USER).
RUN groupadd --system --gid 65532 frscope \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin frscope
COPY --from=build /opt/frscope /opt/frscope
# Byte code is compiled at build time: the root filesystem is read-only at run time.
ENV PATH=/opt/frscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# 9402: the sidecar (API and /metrics); 8080 and 9443: the operator (HTTP, admission webhook).
EXPOSE 9402 8080 9443
ENTRYPOINT ["frscope"]
CMD ["--help"]
