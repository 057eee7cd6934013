# The service and the payments example, for docker-compose.yml.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked -p idempotency-service --bin idempotency-service \
 && cargo build --release --locked -p idempotency-guard --example payments \
 && cp target/release/idempotency-service target/release/examples/payments /usr/local/bin/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/idempotency-service /usr/local/bin/payments /usr/local/bin/
USER 65534:65534
CMD ["idempotency-service", "serve"]
