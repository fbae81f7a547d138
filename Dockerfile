# agentd as a container's entrypoint: PID 1, reaps zombies, stops workers on SIGTERM.
# Build FROM this image and add your framework (e.g. the CPU or CUDA build of torch) and code:
#   FROM agentd:0.1.0
#   RUN pip install --no-cache-dir torch==2.13.0
#   COPY train.py .
#   CMD ["run", "--standalone", "--nproc-per-node", "2", "train.py"]
FROM python:3.11.7-slim-bookworm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    AGENTD_HEALTH_PORT=29401 \
    AGENTD_HEALTH_HOST=0.0.0.0

COPY pyproject.toml README.md /src/
COPY agentd /src/agentd
RUN pip install --no-cache-dir /src \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin agentd

USER 10001:10001
WORKDIR /home/agentd
EXPOSE 29401
STOPSIGNAL SIGTERM
HEALTHCHECK --interval=10s --timeout=4s --start-period=30s --retries=3 \
    CMD ["agentd", "status", "--check", "livez", "--timeout", "3"]
ENTRYPOINT ["agentd"]
CMD ["--help"]
