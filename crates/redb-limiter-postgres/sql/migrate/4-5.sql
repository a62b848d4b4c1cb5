-- redb-limiter, PostgreSQL mode: format version 4 to 5. `__SCHEMA__` stands for the quoted
-- schema. The server runs it before sql/schema.sql when the schema carries version 4; it does
-- nothing unless the schema still does (so servers starting at once migrate once).
--
-- Version 5 keeps request ids (wire section 16): the table requests, empty at first (version 4
-- named no acquire by id). Nothing of version 4 changes: its grants, permits, places, tickets
-- and lines are served as they are. The functions that read the table (acquire_id(), undo(),
-- sweep()'s new step, settle()'s shared half _settle_grant()) are created by sql/schema.sql,
-- which the server runs next, replacing every function of version 4.
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
  IF v_version IS DISTINCT FROM 4 THEN
    RETURN;
  END IF;
  CREATE TABLE IF NOT EXISTS __SCHEMA__.requests (
    id text COLLATE "C" PRIMARY KEY,
    params text NOT NULL,
    until bigint NOT NULL,
    outcome text NOT NULL CHECK (outcome IN ('g', 't', 'r')),
    at bigint,
    permit text COLLATE "C",
    windows jsonb,
    ticket text COLLATE "C",
    retry_at bigint,
    reason text,
    lim text,
    lapse_at bigint
  );
  CREATE INDEX IF NOT EXISTS requests_until ON __SCHEMA__.requests (until);
  UPDATE __SCHEMA__.meta SET version = 5;
END
$migrate$;

COMMIT;
