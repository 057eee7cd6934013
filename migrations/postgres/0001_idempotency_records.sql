-- One record per (scope, key): the claim, its lease, and the stored response.
-- Never edit this file once applied; add a new numbered migration instead.
create table idempotency_records (
    scope            text        not null check (octet_length(scope) between 1 and 255),
    key              text        not null check (octet_length(key) between 1 and 255),
    fingerprint      bytea       not null check (octet_length(fingerprint) = 32),
    method           text        not null,
    path             text        not null,
    state            text        not null check (state in ('in_flight', 'completed')),
    lease_token      uuid        not null,
    lease_expires_at timestamptz not null,
    transactional    boolean     not null,
    response_status  smallint,
    response_headers bytea,
    -- null on a completed record: the response was too large to store
    response_body    bytea,
    created_at       timestamptz not null,
    completed_at     timestamptz,
    expires_at       timestamptz not null,
    primary key (scope, key),
    check ((state = 'completed') = (response_status is not null))
);

create index idempotency_records_expires_at on idempotency_records (expires_at);
