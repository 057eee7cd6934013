# The service and the payments example, for docker-compose.yml; the
# gateway is its own target (`docker build --target gateway .`).
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
EXPOSE 8080
CMD ["idempotency-gateway"]

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/idempotency-service /usr/local/bin/payments /usr/local/bin/
USER 65534:65534
CMD ["idempotency-service", "serve"]
