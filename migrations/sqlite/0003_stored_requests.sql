-- The request a resumable run keeps for the completer (method, path, the
-- headers the route names, body, and the completer's attempts; sealed in
-- an encrypted store), null when the route keeps none. Older releases
-- name their columns and never read this one.
-- Never edit this file once applied; add a new numbered migration instead.
alter table idempotency_records add column request blob;
