-- redb-limiter, PostgreSQL mode: format version 2 to 3. `__SCHEMA__` stands for the quoted
-- schema. The server runs it before sql/schema.sql when the schema carries version 2; it does
-- nothing unless the schema still does (so servers starting at once migrate once).
--
-- Version 3 adds the line (wire section 12): the sequence that numbers tickets, the tickets
-- and each bucket's line. No data of version 2 changes: a version 2 schema has no line.
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
  IF v_version IS DISTINCT FROM 2 THEN
    RETURN;
  END IF;
  CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.ticket_numbers;
  CREATE TABLE IF NOT EXISTS __SCHEMA__.tickets (
    num bigint PRIMARY KEY,
    ticket text COLLATE "C" NOT NULL UNIQUE,
    caller text COLLATE "C" NOT NULL,
    bound jsonb NOT NULL,
    keys text[] COLLATE "C" NOT NULL,
    retry_at bigint NOT NULL,
    lapse_at bigint NOT NULL,
    grace_ms bigint NOT NULL,
    filed_at bigint NOT NULL
  );
  CREATE INDEX IF NOT EXISTS tickets_lapse ON __SCHEMA__.tickets (lapse_at);
  CREATE TABLE IF NOT EXISTS __SCHEMA__.line (
    bucket text COLLATE "C" NOT NULL,
    num bigint NOT NULL,
    PRIMARY KEY (bucket, num)
  );
  UPDATE __SCHEMA__.meta SET version = 3;
END
$migrate$;

COMMIT;
