-- The steps a run recorded (a JSON array of {"n": name, "i": input hash,
-- "v": result}), null when it recorded none. Older releases name their
-- columns and never read this one.
-- Never edit this file once applied; add a new numbered migration instead.
alter table idempotency_records add column steps blob;
