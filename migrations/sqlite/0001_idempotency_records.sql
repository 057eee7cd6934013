-- One record per (scope, key): the claim, its lease, and the stored response.
-- Times are Unix milliseconds (UTC). Same version numbers as migrations/postgres.
-- Never edit this file once applied; add a new numbered migration instead.
create table idempotency_records (
    scope            text    not null check (length(cast(scope as blob)) between 1 and 255),
    key              text    not null check (length(cast(key as blob)) between 1 and 255),
    fingerprint      blob    not null check (length(fingerprint) = 32),
    method           text    not null,
    path             text    not null,
    state            text    not null check (state in ('in_flight', 'completed')),
    lease_token      blob    not null check (length(lease_token) = 16),
    lease_expires_at integer not null,
    transactional    integer not null,
    response_status  integer,
    response_headers blob,
    -- null on a completed record: the response was too large to store
    response_body    blob,
    created_at       integer not null,
    completed_at     integer,
    expires_at       integer not null,
    primary key (scope, key),
    check ((state = 'completed') = (response_status is not null))
);

create index idempotency_records_expires_at on idempotency_records (expires_at);
