-- pgbench's 3-statement default-mode cycle: the claim as a plain insert, the
-- payment, the completion (table r, made by scripts/single-commit-vs-pgbench).
\set k random(1, 1000000000)
insert into r select 'default', :k || '-' || :client_id, 'in_flight', null on conflict do nothing;
insert into payments (tenant, amount, currency) values ('default', 100, 'EUR') returning id;
update r set state = 'completed', body = '\x7b7d' where scope = 'default' and key = :k || '-' || :client_id;
