# syntax=docker/dockerfile:1
# The Meridian member agent (`meridian-agent` binary of the `meridian-agent` package).
# Build from the repository root:
#   docker build -f deploy/docker/agent.Dockerfile -t meridian-agent:0.1.0 .
# Run (the Helm chart in deploy/helm/meridian-agent mounts the same paths):
#   docker run -v $PWD/agent.yaml:/etc/meridian/config/agent.yaml:ro \
#     -v $PWD/certs:/etc/meridian/tls:ro meridian-agent:0.1.0
# The agent listens on no port: it dials the gateway. For `backend: slurm` build FROM this
# image and add the Slurm client tools (sbatch, squeue, scancel, sinfo) and munge.
# tests/tests/helm.rs keeps this file honest (package, binary, config path).

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p meridian-agent --bin meridian-agent \
    && install -D -m 0755 target/release/meridian-agent /out/meridian-agent

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 meridian \
    && useradd --system --uid 10001 --gid 10001 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin meridian \
    && install -d -m 0755 /etc/meridian/config /etc/meridian/tls
COPY --from=builder /out/meridian-agent /usr/local/bin/meridian-agent
USER 10001:10001
ENTRYPOINT ["/usr/local/bin/meridian-agent"]
CMD ["--config", "/etc/meridian/config/agent.yaml"]
