"""A client nobody here wrote: Python's grpcio, calling
/payments.v1.Payments/CreatePayment through grpcio's generic unary_unary
with hand-encoded protobuf bytes (no generated stubs), and reporting what
grpcio read of each answer.

    python calls.py < plan.json > seen.json

The plan (JSON on standard input):

    {"target": "HOST:PORT",
     "service_config": null or a service config (its retryPolicy is used),
     "parallel": false or the number of calls to run at once,
     "calls": [{"account": "...", "amount_cents": 5,
                "metadata": [["idempotency-key", "k"], ...]}, ...]}

Standard output: a JSON list, one entry per call in the plan's order:

    {"code": <grpc status code number>, "details": "<message>",
     "initial": [[name, hex of the value's bytes], ...],
     "trailing": [[name, hex], ...], "message": "<hex>" or null}

`trailing` holds grpc-status-details-bin as grpcio hands it on (grpcio
reads grpc-status and grpc-message itself). Exits non-zero only when the
plan cannot be run.
"""

import json
import sys
from concurrent.futures import ThreadPoolExecutor

import grpc

METHOD = "/payments.v1.Payments/CreatePayment"


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


def hex_of(value):
    if isinstance(value, str):
        value = value.encode()
    return value.hex()


def pairs(metadata):
    return [[key, hex_of(value)] for key, value in (metadata or ())]


def main():
    plan = json.load(sys.stdin)
    options = []
    if plan.get("service_config") is not None:
        options = [
            ("grpc.enable_retries", 1),
            ("grpc.service_config", json.dumps(plan["service_config"])),
        ]
    else:
        options = [("grpc.enable_retries", 0)]
    channel = grpc.insecure_channel(plan["target"], options=options)
    create = channel.unary_unary(
        METHOD,
        request_serializer=lambda b: b,
        response_deserializer=lambda b: b,
    )

    def call(spec):
        request = encode_create(spec["account"], spec.get("amount_cents", 1250), "EUR")
        metadata = [tuple(pair) for pair in spec.get("metadata", [])]
        try:
            answer, rpc = create.with_call(request, metadata=metadata, timeout=20)
            return {
                "code": rpc.code().value[0],
                "details": rpc.details() or "",
                "initial": pairs(rpc.initial_metadata()),
                "trailing": pairs(rpc.trailing_metadata()),
                "message": answer.hex(),
            }
        except grpc.RpcError as error:
            return {
                "code": error.code().value[0],
                "details": error.details() or "",
                "initial": pairs(error.initial_metadata()),
                "trailing": pairs(error.trailing_metadata()),
                "message": None,
            }

    parallel = plan.get("parallel") or 1
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        seen = list(pool.map(call, plan["calls"]))
    json.dump(seen, sys.stdout)


if __name__ == "__main__":
    main()
