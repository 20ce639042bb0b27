# syntax=docker/dockerfile:1
# One image, two entry points:  `frscope operator`  and  `frscope sidecar`  (charts/frscope uses both).
#
#   docker build -t frscope:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t frscope:0.1.0 .     (.github/workflows/release.yml)
#   docker run --rm frscope:0.1.0 --version        frscope 0.1.0 (dump reader: C scanner)
#
# Three stages: `build` (a Python with gcc and its headers) builds frscope's wheel with the C scanner
# (frscope/records/_frscan.c); `install` makes the virtual environment on the final base from that wheel and
# the pinned dependencies, every file checked against its hash (requirements/image.txt, scripts/lock-deps);
# the final stage copies only that environment onto a clean slim base: no compiler, no pip. torch is not a
# dependency: the sidecar talks to the trainer's worker server over a unix socket.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm
# The same Python as PYTHON_IMAGE, with gcc and Python's headers (the full image has both).
ARG BUILDER_IMAGE=python:3.11-bookworm

FROM ${BUILDER_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# The build backend, pinned and hash-checked (requirements/build.txt), used without build isolation so that
# nothing else is fetched.
COPY requirements/build.txt requirements/build.txt
RUN python -m venv /opt/build \
    && /opt/build/bin/pip install --only-binary=:all: --require-hashes -r requirements/build.txt
COPY pyproject.toml setup.py README.md LICENSE ./
COPY frscope ./frscope
# The wheel must carry the scanner (setup.py only warns when it cannot build it); frscope.txt names the
# wheel with its hash so the install stage installs everything in hash-checking mode.
RUN /opt/build/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
    && /opt/build/bin/python -c "import sys, zipfile; from pathlib import Path; \
whl, = Path('/dist').glob('frscope-*.whl'); \
sys.exit(0 if any(n.startswith('frscope/records/_frscan.') for n in zipfile.ZipFile(whl).namelist()) \
else f'{whl.name} has no C scanner')" \
    && cd /dist && echo "frscope @ file://$(ls /dist/frscope-*.whl) --hash=sha256:$(sha256sum frscope-*.whl | cut -d' ' -f1)" \
       > /dist/frscope.txt

FROM ${PYTHON_IMAGE} AS install
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# Binaries only (every dependency ships wheels for amd64 and arm64), every file's hash checked. The
# dependencies first: a layer that survives source changes.
COPY requirements/image.txt /tmp/requirements/image.txt
RUN python -m venv /opt/frscope \
    && /opt/frscope/bin/pip install --only-binary=:all: --require-hashes -r /tmp/requirements/image.txt
# Then frscope's wheel (hash-checked too), the environment checked (pip check: the pins satisfy the wheel's
# requirements; the scanner imports), pip itself removed and byte code compiled: the root filesystem is
# read-only at run time.
COPY --from=build /dist /dist
RUN /opt/frscope/bin/pip install --no-deps --require-hashes -r /dist/frscope.txt \
    && /opt/frscope/bin/pip check \
    && /opt/frscope/bin/pip uninstall --yes pip setuptools \
    && /opt/frscope/bin/python -m compileall -q /opt/frscope/lib \
    && /opt/frscope/bin/python -c "import frscope.records._frscan" \
    && /opt/frscope/bin/frscope --version | grep -F "(dump reader: C scanner)"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="frscope" \
      org.opencontainers.image.description="Diagnoses hung PyTorch distributed jobs from the Flight Recorder" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://github.com/frscope/frscope"
# A numeric, non-root user (the chart runs as 65532 with runAsNonRoot, which needs a numeric USER).
RUN groupadd --system --gid 65532 frscope \
    && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin frscope
COPY --from=install /opt/frscope /opt/frscope
ENV PATH=/opt/frscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# 9402: the sidecar (API and /metrics); 8080 and 9443: the operator (HTTP, admission webhook).
EXPOSE 9402 8080 9443
ENTRYPOINT ["frscope"]
CMD ["--help"]
