-- redb-limiter, PostgreSQL mode: format version 3 to 4. `__SCHEMA__` stands for the quoted
-- schema. The server runs it before sql/schema.sql when the schema carries version 3; it does
-- nothing unless the schema still does (so servers starting at once migrate once).
--
-- Version 4 bounds the line (wire section 12.9): each bucket counts its line in its row (the
-- row is the line's lock, so a bucket with a line gets one), each line row carries what the
-- line's walk reads of its ticket (its lapse, caller and limit there), a ticket carries its
-- deadline (its filing plus the default horizon: version 3 knew none) and whether its lapse
-- was counted, and meta the latest instant a server was seen at. The tickets and lines of
-- version 3 are kept as they are.
BEGIN;

SET LOCAL client_min_messages = warning;
SELECT pg_advisory_xact_lock(hashtext('redb-limiter schema __SCHEMA__'));

DO $migrate$
DECLARE
  v_version integer;
BEGIN
  IF to_regclass('__SCHEMA__.meta') IS NULL THEN
    RETURN;
  END IF;
  SELECT max(version) INTO v_version FROM __SCHEMA__.meta;
  IF v_version IS DISTINCT FROM 3 THEN
    RETURN;
  END IF;
  ALTER TABLE __SCHEMA__.meta ADD COLUMN IF NOT EXISTS alive_at bigint NOT NULL DEFAULT 0;
  ALTER TABLE __SCHEMA__.buckets ADD COLUMN IF NOT EXISTS queued bigint NOT NULL DEFAULT 0;
  ALTER TABLE __SCHEMA__.tickets ADD COLUMN IF NOT EXISTS deadline bigint;
  ALTER TABLE __SCHEMA__.tickets ADD COLUMN IF NOT EXISTS counted boolean NOT NULL DEFAULT false;
  UPDATE __SCHEMA__.tickets SET deadline = greatest(filed_at + 300000, lapse_at);
  ALTER TABLE __SCHEMA__.tickets ALTER COLUMN deadline SET NOT NULL;
  ALTER TABLE __SCHEMA__.line
    ADD COLUMN IF NOT EXISTS lapse_at bigint,
    ADD COLUMN IF NOT EXISTS caller text COLLATE "C",
    ADD COLUMN IF NOT EXISTS calls bigint,
    ADD COLUMN IF NOT EXISTS per_ms bigint,
    ADD COLUMN IF NOT EXISTS cost bigint,
    ADD COLUMN IF NOT EXISTS conc bigint;
  UPDATE __SCHEMA__.line q
     SET lapse_at = t.lapse_at, caller = t.caller,
         calls = coalesce((x.l->>'calls')::bigint, 0),
         per_ms = coalesce((x.l->>'perMs')::bigint, 0),
         cost = CASE WHEN x.l ? 'calls'
                     THEN least(coalesce((x.l->>'cost')::bigint, 1), (x.l->>'calls')::bigint) ELSE 0 END,
         conc = coalesce((x.l->>'concurrent')::bigint, 0)
    FROM __SCHEMA__.tickets t
    CROSS JOIN LATERAL (SELECT b AS l FROM jsonb_array_elements(t.bound) AS b) x
   WHERE t.num = q.num AND x.l->>'key' = q.bucket;
  -- (a line row whose ticket is gone is left by no reader: drop it)
  DELETE FROM __SCHEMA__.line WHERE lapse_at IS NULL;
  ALTER TABLE __SCHEMA__.line
    ALTER COLUMN lapse_at SET NOT NULL, ALTER COLUMN caller SET NOT NULL, ALTER COLUMN calls SET NOT NULL,
    ALTER COLUMN per_ms SET NOT NULL, ALTER COLUMN cost SET NOT NULL, ALTER COLUMN conc SET NOT NULL;
  CREATE INDEX IF NOT EXISTS line_lapse ON __SCHEMA__.line (bucket, lapse_at);
  INSERT INTO __SCHEMA__.buckets (key) SELECT DISTINCT q.bucket FROM __SCHEMA__.line q ON CONFLICT (key) DO NOTHING;
  UPDATE __SCHEMA__.buckets bk SET queued = c.n
    FROM (SELECT q.bucket, count(*) AS n FROM __SCHEMA__.line q GROUP BY q.bucket) c
   WHERE bk.key = c.bucket;
  UPDATE __SCHEMA__.meta SET version = 4;
END
$migrate$;

COMMIT;
