"""A client nobody here wrote: Python's grpcio, with a service config
retryPolicy (maxAttempts 5, retryable UNAVAILABLE), calling
/payments.v1.Payments/CreatePayment through grpcio's generic unary_unary
with hand-encoded protobuf bytes (no generated stubs).

    python retry_client.py HOST:PORT RUN_ID PAYMENTS

Sends PAYMENTS payments, each with its own idempotency-key, concurrently;
prints one line per payment: `<account> <executions>` of the answer it
ended with. Exits non-zero when a call failed.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc

METHOD = "/payments.v1.Payments/CreatePayment"

SERVICE_CONFIG = json.dumps(
    {
        "methodConfig": [
            {
                "name": [{"service": "payments.v1.Payments"}],
                "retryPolicy": {
                    "maxAttempts": 5,
                    "initialBackoff": "0.01s",
                    "maxBackoff": "0.1s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ]
    }
)


def varint(n):
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def field_bytes(number, data):
    return varint(number << 3 | 2) + varint(len(data)) + data


def encode_create(account, amount_cents, currency):
    return (
        field_bytes(1, account.encode())
        + varint(2 << 3 | 0)
        + varint(amount_cents)
        + field_bytes(3, currency.encode())
    )


def decode(message):
    """The fields of a protobuf message: {number: value} (varints and
    length-delimited only, as Payment has)."""
    fields, i = {}, 0
    while i < len(message):
        key, i = read_varint(message, i)
        number, kind = key >> 3, key & 7
        if kind == 0:
            fields[number], i = read_varint(message, i)
        elif kind == 2:
            length, i = read_varint(message, i)
            fields[number] = message[i : i + length]
            i += length
        else:
            raise ValueError(f"unexpected wire type {kind}")
    return fields


def read_varint(data, i):
    shift = result = 0
    while True:
        byte = data[i]
        i += 1
        result |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return result, i


def main():
    target, run_id, payments = sys.argv[1], sys.argv[2], int(sys.argv[3])
    channel = grpc.insecure_channel(
        target,
        options=[("grpc.enable_retries", 1), ("grpc.service_config", SERVICE_CONFIG)],
    )
    create = channel.unary_unary(
        METHOD,
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )

    def pay(n):
        account = f"{run_id}-{n}"
        answer = create(
            encode_create(account, 100 + n, "EUR"),
            metadata=[("idempotency-key", f"py-{account}")],
            timeout=10,
        )
        fields = decode(answer)
        return fields[2].decode(), fields.get(5, 0)

    with ThreadPoolExecutor(max_workers=16) as pool:
        for account, executions in pool.map(pay, range(payments)):
            print(account, executions)


if __name__ == "__main__":
    main()
