# The GPU worker image: the NeMo / Megatron-Bridge container (Python 3.12, CUDA, torch,
# transformer-engine, megatron-bridge) plus autotune and workers/. One per GPU node; it joins the
# Ray cluster as a worker node (see docker/README.md). Ray must be the same version as the controller's.
ARG BASE_IMAGE=nvcr.io/nvidia/nemo:26.08
FROM ${BASE_IMAGE}
ARG RAY_VERSION=2.60.0
WORKDIR /opt/autotune
COPY pyproject.toml README.md ./
COPY autotune ./autotune
COPY search_spaces ./search_spaces
COPY alembic ./alembic
COPY workers ./workers
# --no-deps for autotune itself: the container's torch and megatron-bridge must stay as they are.
RUN pip install --no-cache-dir "ray[default]==${RAY_VERSION}" "optuna>=5.0,<6" "sqlalchemy>=2.0" "alembic>=1.13" \
        "pandas>=2.0" "pyarrow>=14" "pyyaml>=6.0" "rich>=13.0" "psycopg[binary]>=3.1" "prometheus-client>=0.17" \
    && pip install --no-cache-dir --no-deps . \
    && python -c "import autotune, workers.launcher, megatron.bridge"
ENV RAY_USAGE_STATS_ENABLED=0
CMD ["bash", "-c", "ray start --address=${RAY_HEAD_ADDRESS:?set RAY_HEAD_ADDRESS=host:6379} --block"]
