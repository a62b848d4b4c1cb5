-- redb-limiter, PostgreSQL mode: format version 5 to 6. `__SCHEMA__` stands for the quoted
-- schema. The server runs it before sql/schema.sql when the schema carries version 5; it does
-- nothing unless the schema still does (so servers starting at once migrate once).
--
-- Version 6 keeps token buckets (wire section 13): the table levels, empty at first (version 5
-- served no bucket), sweep()'s cursor in its keys (meta.level_cursor), and each line row's bucket figures (refill, burst, initial; 0 where the
-- ticket names no bucket there, which every row of version 5 is). Nothing of version 5 changes:
-- its grants, permits, places, tickets, lines and request ids are served as they are. The
-- functions that read the new table and columns are created by sql/schema.sql, which the
-- server runs next, replacing every function of version 5.
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
  IF v_version IS DISTINCT FROM 5 THEN
    RETURN;
  END IF;
  CREATE TABLE IF NOT EXISTS __SCHEMA__.levels (
    key text COLLATE "C" PRIMARY KEY,
    units bigint NOT NULL,
    unit_ms bigint NOT NULL,
    refill bigint NOT NULL,
    burst bigint NOT NULL,
    at bigint NOT NULL,
    forget_at bigint NOT NULL
  )
  WITH (fillfactor = 50);
  ALTER TABLE __SCHEMA__.meta ADD COLUMN IF NOT EXISTS level_cursor text COLLATE "C" NOT NULL DEFAULT '';
  ALTER TABLE __SCHEMA__.line
    ADD COLUMN IF NOT EXISTS refill bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS burst bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS initial bigint NOT NULL DEFAULT 0;
  UPDATE __SCHEMA__.meta SET version = 6;
END
$migrate$;

COMMIT;
