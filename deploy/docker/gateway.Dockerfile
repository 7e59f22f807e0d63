# syntax=docker/dockerfile:1
# The Meridian gateway (the `meridian` binary of the `meridian` package, gateway/meridian/).
# Build from the repository root:
#   docker build -f deploy/docker/gateway.Dockerfile -t meridian-gateway:0.1.0 .
# Run (the Helm chart in deploy/helm/meridian-gateway mounts the same paths):
#   docker run -v $PWD/gateway.yaml:/etc/meridian/config/gateway.yaml:ro \
#     -v meridian-data:/var/lib/meridian -p 7070:7070 -p 7071:7071 meridian-gateway:0.1.0
# The image runs either store: the embedded one (a volume at /var/lib/meridian) or etcd
# (`store.kind: etcd`, several gateways; docs/operations.md#high-availability), so the binary is
# built with cargo feature `etcd`.
# tests/tests/helm.rs keeps this file honest: the package and binary exist in the workspace,
# EXPOSE are the ports the chart serves on, the config and data paths are the chart's, the build
# has the etcd store and what it needs.

ARG RUST_VERSION=1.95
FROM rust:${RUST_VERSION}-bookworm AS builder
# The etcd store's client (etcd-client) compiles etcd's .proto files with protoc in its build
# script, and they import google/protobuf/*.proto from libprotobuf-dev. Meridian's own protos need
# neither (protox compiles them in Rust).
RUN apt-get update \
    && apt-get install -y --no-install-recommends protobuf-compiler libprotobuf-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The registry and target caches survive between builds (BuildKit); the binary is copied out of
# the cached target dir because a cache mount is not part of the image.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p meridian --bin meridian --features etcd \
    && install -D -m 0755 target/release/meridian /out/meridian

FROM debian:bookworm-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 meridian \
    && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/meridian --no-create-home \
       --shell /usr/sbin/nologin meridian \
    && install -d -o 10001 -g 10001 -m 0750 /var/lib/meridian \
    && install -d -m 0755 /etc/meridian/config
COPY --from=builder /out/meridian /usr/local/bin/meridian
# The embedded store (redb, one writer: the gateway locks the directory); unused with etcd.
VOLUME ["/var/lib/meridian"]
WORKDIR /var/lib/meridian
USER 10001:10001
# REST (CLI, console, /healthz) and gRPC (Jobs service, agents' Federation stream).
EXPOSE 7070 7071
ENTRYPOINT ["/usr/local/bin/meridian"]
CMD ["gateway", "--config", "/etc/meridian/config/gateway.yaml"]
