# The CPU image of vllm-srun: `vllm-srun serve` (a worker) and `vllm-sr serve` (the front).
# It installs exactly as the README does (tests/unit/test_deploy_manifests.py keeps the RUN line
# below equal to the README's command), with the embedded default model pulled into the image.
#
#   docker build -t vllm-srun:0.1.0-cpu .
#   docker run --rm -p 8100:8100 vllm-srun:0.1.0-cpu                    # a worker, all-MiniLM-L6-v2
#   docker run --rm -p 8000:8000 vllm-srun:0.1.0-cpu vllm-sr serve --host 0.0.0.0 --config /etc/vllm-sr/config.yaml
#
# Runs as uid 10001 and works with a read-only root filesystem: it writes only under /tmp and
# the engine cache (/var/cache/vllm-srun); mount both writable (deploy/kubernetes does).
FROM python:3.11-slim

WORKDIR /opt/vllm-srun
ENV VLLM_SRUN_MODELS=/opt/vllm-srun/models \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY pyproject.toml setup.py README.md ./
COPY src ./src
RUN python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0 -e . && vllm-srun pull all-MiniLM-L6-v2

ENV PATH=/opt/vllm-srun/.venv/bin:$PATH \
    VLLM_SRUN_ENGINE_CACHE=/var/cache/vllm-srun \
    HOME=/tmp \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m compileall -q src
RUN useradd --uid 10001 --gid 0 --home-dir /tmp --no-create-home --shell /usr/sbin/nologin vllm \
    && mkdir -p /var/cache/vllm-srun && chown 10001:0 /var/cache/vllm-srun
USER 10001
EXPOSE 8100 8000
CMD ["vllm-srun", "serve", "--host", "0.0.0.0"]
