-- redb-limiter, PostgreSQL mode: format version 1 to 2. `__SCHEMA__` stands for the quoted
-- schema. The server runs it before sql/schema.sql when the schema carries version 1; it does
-- nothing unless the schema still does (so servers starting at once migrate once).
--
-- Version 2 stores every key and permit string escaped (src/keys.rs): U+0000 as U+0001 U+0001,
-- U+0001 as U+0001 U+0002, so that every UTF-8 string is stored, in the same order. Version 1
-- stored them as they were and could hold no U+0000, so the only change to its data is that
-- each U+0001 becomes U+0001 U+0002: in bucket keys (rows reinserted with their ids, so grants,
-- places and Fenwick nodes stay theirs), throttle keys, permit ids (with their places) and the
-- keys a permit's windows name. The sweep cursor starts again from the first key.
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
  IF v_version IS DISTINCT FROM 1 THEN
    RETURN;
  END IF;

  -- Keys holding U+0001: taken out and put back escaped (two keys never meet halfway, as an
  -- UPDATE in place could make them while some are escaped and others not).
  CREATE TEMPORARY TABLE redb_limiter_m_buckets ON COMMIT DROP AS
    SELECT * FROM __SCHEMA__.buckets WHERE strpos(key, chr(1)) > 0;
  DELETE FROM __SCHEMA__.buckets WHERE strpos(key, chr(1)) > 0;
  INSERT INTO __SCHEMA__.buckets (key, id, retain_ms, pruned_to, dtotal, fen, last_calls, last_concurrent,
                                  total, last_seq, last_at, floor_ms) OVERRIDING SYSTEM VALUE
  SELECT replace(m.key, chr(1), chr(1) || chr(2)), m.id, m.retain_ms, m.pruned_to, m.dtotal, m.fen,
         m.last_calls, m.last_concurrent, m.total, m.last_seq, m.last_at, m.floor_ms
    FROM redb_limiter_m_buckets m;

  CREATE TEMPORARY TABLE redb_limiter_m_throttles ON COMMIT DROP AS
    SELECT * FROM __SCHEMA__.throttles WHERE strpos(key, chr(1)) > 0;
  DELETE FROM __SCHEMA__.throttles WHERE strpos(key, chr(1)) > 0;
  INSERT INTO __SCHEMA__.throttles (key, until)
  SELECT replace(m.key, chr(1), chr(1) || chr(2)), m.until FROM redb_limiter_m_throttles m;

  -- Permit ids (this release's are plain ASCII; any other string is escaped all the same).
  CREATE TEMPORARY TABLE redb_limiter_m_permits ON COMMIT DROP AS
    SELECT * FROM __SCHEMA__.permits WHERE strpos(id, chr(1)) > 0;
  DELETE FROM __SCHEMA__.permits WHERE strpos(id, chr(1)) > 0;
  INSERT INTO __SCHEMA__.permits (id, at, lapse, place_buckets, place_lapses, windows)
  SELECT replace(m.id, chr(1), chr(1) || chr(2)), m.at, m.lapse, m.place_buckets, m.place_lapses, m.windows
    FROM redb_limiter_m_permits m;
  CREATE TEMPORARY TABLE redb_limiter_m_places ON COMMIT DROP AS
    SELECT * FROM __SCHEMA__.places WHERE strpos(permit, chr(1)) > 0;
  DELETE FROM __SCHEMA__.places WHERE strpos(permit, chr(1)) > 0;
  INSERT INTO __SCHEMA__.places (bucket, lapse, permit)
  SELECT m.bucket, m.lapse, replace(m.permit, chr(1), chr(1) || chr(2)) FROM redb_limiter_m_places m;

  -- The window keys a permit names, for settle.
  UPDATE __SCHEMA__.permits pm
     SET windows = (SELECT coalesce(jsonb_agg(
                             CASE WHEN strpos(w.value->>'k', chr(1)) > 0
                                  THEN jsonb_set(w.value, '{k}', to_jsonb(replace(w.value->>'k', chr(1), chr(1) || chr(2))))
                                  ELSE w.value END ORDER BY w.ord), '[]'::jsonb)
                      FROM jsonb_array_elements(pm.windows) WITH ORDINALITY AS w(value, ord))
   WHERE EXISTS (SELECT 1 FROM jsonb_array_elements(pm.windows) w WHERE strpos(w->>'k', chr(1)) > 0);

  UPDATE __SCHEMA__.meta SET version = 2, sweep_cursor = '';
END
$migrate$;

COMMIT;
