# syntax=docker/dockerfile:1
# The `chorus` binary in a small runtime image. Build: `docker build -t chorus .`
# (docker-compose.yml does this). No protoc is needed: protos are compiled with protox.

FROM rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
# The registry, git and target caches survive between builds (BuildKit cache mounts), so a
# rebuild after a source change recompiles only chorus's own crates. target/ is a cache mount,
# so the binary is copied out within the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked -p chorus \
    && install -D -m 0755 target/release/chorus /out/chorus

FROM debian:bookworm-slim
# ca-certificates for TLS to remote peers; curl for the compose healthcheck on /healthz.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates curl \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /var/lib/chorus chorus
COPY --from=builder /out/chorus /usr/local/bin/chorus
# The example workflows, which `chorus dev` loads from ./workflows.
COPY workflows /var/lib/chorus/workflows
USER chorus
# `chorus dev` keeps its SQLite files under ./.chorus, i.e. here.
WORKDIR /var/lib/chorus
EXPOSE 7800
# What agent cards advertise: the address `docker run -p 7800:7800` publishes (override it
# for any other), not the 0.0.0.0 the server listens on.
ENV CHORUS_GATEWAY__PUBLIC_URL=http://localhost:7800
ENTRYPOINT ["chorus"]
# `docker run -p 7800:7800 chorus` runs every service in one process.
CMD ["dev", "--listen", "0.0.0.0:7800"]
