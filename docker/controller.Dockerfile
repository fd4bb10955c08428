# The controller image: autotune, Ray head, dashboard. Same Python minor version (3.12) as the
# worker image, because Ray requires the driver and every worker to share it. No torch, no GPU.
FROM python:3.12-slim
ARG RAY_VERSION=2.60.0
WORKDIR /opt/autotune
COPY pyproject.toml README.md ./
COPY autotune ./autotune
COPY search_spaces ./search_spaces
COPY alembic ./alembic
COPY workers ./workers
RUN pip install --no-cache-dir "ray[default]==${RAY_VERSION}" . && autotune --version
ENV RAY_USAGE_STATS_ENABLED=0
ENTRYPOINT ["autotune"]
CMD ["--help"]
