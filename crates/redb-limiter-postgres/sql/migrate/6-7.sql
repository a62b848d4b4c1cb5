-- redb-limiter, PostgreSQL mode: format version 6 to 7. `__SCHEMA__` stands for the quoted
-- schema. The server runs it before sql/schema.sql when the schema carries version 6; it does
-- nothing unless the schema still does (so servers starting at once migrate once).
--
-- Version 7 keeps adaptive ceilings (wire section 14): the table ceilings, empty at first
-- (version 6 served no `adapt`), each permit's adapted buckets (permits.adapted; NULL, none,
-- for every permit of version 6), and each line row's adapt figures (adapt_min, adapt_max,
-- asked_cost; NULL, it does not adapt, for every row of version 6). Nothing of version 6
-- changes: its grants, permits, places, tickets, lines, request ids and levels are served as
-- they are. The functions that read the new table and columns are created by sql/schema.sql,
-- which the server runs next, replacing every function of version 6.
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
  IF v_version IS DISTINCT FROM 6 THEN
    RETURN;
  END IF;
  CREATE TABLE IF NOT EXISTS __SCHEMA__.ceilings (
    key text COLLATE "C" PRIMARY KEY,
    c bigint NOT NULL,
    max bigint NOT NULL,
    cut_at bigint,
    cuts bigint NOT NULL,
    grown_at bigint,
    signal_at bigint NOT NULL
  );
  ALTER TABLE __SCHEMA__.permits ADD COLUMN IF NOT EXISTS adapted jsonb;
  ALTER TABLE __SCHEMA__.line
    ADD COLUMN IF NOT EXISTS adapt_min bigint,
    ADD COLUMN IF NOT EXISTS adapt_max bigint,
    ADD COLUMN IF NOT EXISTS asked_cost bigint;
  UPDATE __SCHEMA__.meta SET version = 7;
END
$migrate$;

COMMIT;
