# syntax=docker/dockerfile:1
#
# Tollgate container image: build with BuildKit (the default builder since Docker 23):
#
#   docker build -t tollgate:0.2.0 .
#   docker run --rm -p 8081:8081 -p 8080:8080 -p 6070:6070 \
#     -v "$PWD/examples/config:/etc/tollgate/rules:ro" tollgate:0.2.0
#
# Base images are pinned by tag, not by digest: the digests could not be looked up from the machine this
# file was written on (no registry access). Pin them by digest in your own build
# (`docker buildx imagetools inspect IMAGE` prints it) or override the ARGs below.
# The builder's Debian release (bookworm) must match the runtime's (debian12): a binary linked against a
# newer glibc does not start on an older one.
ARG RUST_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS builder
WORKDIR /src
# Only what the build reads: later edits to docs, the chart or the tests do not invalidate this stage.
# No protoc is needed (build.rs compiles proto/ with protox).
# Every workspace member must be there for cargo to read the workspace, the client included.
COPY Cargo.toml Cargo.lock build.rs ./
COPY proto ./proto
COPY core ./core
COPY clients/rust ./clients/rust
COPY benches ./benches
COPY src ./src
# The registry and target/ live in BuildKit cache mounts, so a rebuild after a source change recompiles
# only Tollgate, not its dependencies. target/ is not part of the image: the binary is copied out of the
# cache in the same RUN. /out/rules becomes the (empty) default rules directory.
RUN --mount=type=cache,target=/usr/local/cargo/registry,sharing=locked \
    --mount=type=cache,target=/usr/local/cargo/git,sharing=locked \
    --mount=type=cache,target=/src/target,sharing=locked \
    cargo build --release --locked --bin tollgate \
    && install -D -m 0755 target/release/tollgate /out/tollgate \
    && mkdir -p /out/rules

# distroless/cc: glibc and libgcc, no shell, no package manager; the `nonroot` variant's user is 65532.
FROM ${RUNTIME_IMAGE}
ARG VERSION=0.2.0
ARG REVISION=unknown
LABEL org.opencontainers.image.title="tollgate" \
      org.opencontainers.image.description="Rate-limit decision service: Envoy RLS v3 compatible, drop-in for envoyproxy/ratelimit" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.base.name="gcr.io/distroless/cc-debian12:nonroot"
COPY --from=builder /out/tollgate /usr/local/bin/tollgate
# Envoy Gateway runs the rate limit container as `/bin/ratelimit` with no arguments. The same binary under
# that name serves, driven by envoyproxy/ratelimit's environment (CONFIG_TYPE, GRPC_SERVER_USE_TLS...).
COPY --from=builder /out/tollgate /bin/ratelimit
# Rules are read from /etc/tollgate/rules (empty in the image: mount a directory of rules files, or a
# ConfigMap as a directory, over it). Tollgate reloads it on any change.
COPY --from=builder --chown=65532:65532 /out/rules /etc/tollgate/rules
ENV TOLLGATE_CONFIG_DIR=/etc/tollgate/rules
# Numeric, so Kubernetes' runAsNonRoot can verify it without looking the name up.
USER 65532:65532
# gRPC (Envoy RLS, health, reflection), HTTP (/healthcheck, /json, /metrics), debug (/rlconfig, /metrics, /top).
EXPOSE 8081 8080 6070
# Liveness over gRPC health (service ""): rules loaded and not shutting down; it does not depend on Redis.
# `--addr` defaults to 127.0.0.1:8081: change it too if you move the gRPC listener.
# Kubernetes ignores HEALTHCHECK; the Helm chart uses native gRPC probes instead.
HEALTHCHECK --interval=10s --timeout=3s --start-period=5s --retries=3 \
    CMD ["/usr/local/bin/tollgate", "healthcheck", "--service", ""]
ENTRYPOINT ["/usr/local/bin/tollgate"]
CMD ["serve"]
