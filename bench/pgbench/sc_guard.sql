-- The guard's own single-commit statements, as the payments example sends
-- them (guard/src/store/postgres/single_commit.rs CLAIM_LOCKED, mod.rs
-- COMPLETE), one round trip each: BEGIN, the claim, the payment, the
-- completion, COMMIT. Keep it in step with those statements.
\set k random(1, 1000000000)
\set lk hash(:k + :client_id * 1000000007)
BEGIN;
with lock as (
        select pg_try_advisory_xact_lock(:lk # 'idempotency_records'::regclass::oid::int8) as held,
               set_config('idle_in_transaction_session_timeout', '30000ms', true) as idle_bound
    ), existing as (
        select fingerprint, method, path, lease_token, lease_expires_at, transactional, response_status, response_headers, response_body, created_at, completed_at, expires_at, steps, request, now() as observed_at from idempotency_records where scope = 'default' and key = 'pgb-' || :k || '-' || :client_id
    ), inserted as (
        insert into idempotency_records
            (scope, key, fingerprint, method, path, state, lease_token, lease_expires_at,
             transactional, created_at, expires_at)
        select 'default', 'pgb-' || :k || '-' || :client_id, '\x0102030405060708091011121314151617181920212223242526272829303132'::bytea, 'POST', '/payments', 'in_flight', '6f1c2b52-3c1e-4f3a-9d5e-000000000000'::uuid, now() + 30000 * interval '1 millisecond',
               true, now(), now() + 86400000 * interval '1 millisecond'
        where (select held from lock) and not exists (select 1 from existing)
        on conflict (scope, key) do nothing
        returning 1
    )
    select (select held from lock) as held, exists (select 1 from inserted) as acquired,
           existing.*
    from (values (1)) as one
    left join existing on true;
insert into payments (tenant, amount, currency) values ('default', 100, 'EUR') returning id;
update idempotency_records set
        state = 'completed', response_status = 201, response_headers = '\x00'::bytea, response_body = '\x7b226964223a317d'::bytea,
        completed_at = clock_timestamp()
    where scope = 'default' and key = 'pgb-' || :k || '-' || :client_id and lease_token = '6f1c2b52-3c1e-4f3a-9d5e-000000000000'::uuid and state = 'in_flight';
COMMIT;
