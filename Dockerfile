# Two container images, one per program (docs/guide/deploy.md):
#
#   docker build --target service -t idempotency-service .   # also the default target
#   docker build --target gateway -t idempotency-gateway .
#
# `service` holds `idempotency-service` (the key-status service, and its
# `migrate` subcommand for the deploy's migration step) and the payments
# example (`payments`, for docker-compose.yml); `gateway` holds
# `idempotency-gateway`. Both listen on 127.0.0.1 unless told otherwise:
# set LISTEN (0.0.0.0:8080 for the service; the gateway's `listen` in its
# configuration, or LISTEN, 0.0.0.0:8090 in docker-compose.yml).
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p idempotency-service --bin idempotency-service \
 && cargo build --release --locked -p idempotency-guard --example payments \
 && cargo build --release --locked -p idempotency-gateway --bin idempotency-gateway \
 && cp target/release/idempotency-service target/release/examples/payments \
       target/release/idempotency-gateway /usr/local/bin/

# The gateway: idempotency keys in front of a backend in any language.
FROM debian:bookworm-slim AS gateway
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/idempotency-gateway /usr/local/bin/
USER 65534:65534
ENV GATEWAY_CONFIG=/etc/idempotency-gateway/gateway.toml
EXPOSE 8090
CMD ["idempotency-gateway"]

# The key-status service (the last stage: what `docker build .` builds).
FROM debian:bookworm-slim AS service
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/idempotency-service /usr/local/bin/payments /usr/local/bin/
USER 65534:65534
EXPOSE 8080
CMD ["idempotency-service", "serve"]
