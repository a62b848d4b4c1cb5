-- redb-limiter, PostgreSQL mode: the one statement that decides a batch of one-window acquires
-- (the requests acquire_window.sql takes, one array element per request) in one round trip and
-- one transaction, as a group commit does. The server sends it when several such requests wait
-- at once (see the crate's docs); `__SCHEMA__` stands for the quoted schema.
--
-- Parameters, one element per request, in batch order: $1 the bucket keys, $2 calls, $3 perMs,
-- $4 costs (as requested: capped at calls here, as acquire() does), $5 the caller keys, $6 at_ms
-- (NULL: the database's clock, read once for the whole batch).
--
-- The instant: one read of the clock for every request of the batch, each floored by its own
-- bucket. A single statement sent at that instant for any of these requests reads the same
-- value; the requests all wait while it is read, so each is decided at an instant within its
-- own request's span, as a single statement would be.
--
-- Each request is judged exactly as acquire_window.sql judges it, on the statement's one
-- snapshot: verdict 'g' a grant, 'r' refused for rate (rate_at), 't' refused for the throttle
-- (until), 'f' anything acquire_window.sql leaves to acquire(). A refusal locks and writes
-- nothing.
--
-- Writes, and why this statement never waits for a lock (so it can never be part of a
-- deadlock, whatever else runs: a cycle of waits needs every member waiting):
--   of the 'g' requests of a bucket, the first in batch order is tried; the bucket row is
--   locked with FOR NO KEY UPDATE SKIP LOCKED and only in the version the snapshot read (xmin
--   unchanged): a row another transaction holds is skipped, never waited for. Then the locked
--   rows are updated (this transaction holds their locks: no wait) and their grant rows
--   inserted (a new millisecond in a bucket whose row this transaction holds: no other
--   transaction can be inserting that key, so the unique check does not wait either).
--   Everything else answers 'a' (alone): an 'f', a 'g' whose row changed or was locked, and a
--   second 'g' of the same bucket in this batch (its row is now written by this very
--   transaction). The server sends each of those through acquire_window.sql once this
--   statement's transaction has committed: that path may wait for a lock, but holds none of
--   this batch's.
-- A refusal of a bucket another request of the batch is granted stands as decided before that
-- grant (both at the same instant): the batch is the same as its refusals, then its grants,
-- one after another at that instant.
--
-- It answers one row per request, in batch order: ord, the verdict ('g', 'r', 't' or 'a'),
-- until, rate_at and now.
WITH c AS MATERIALIZED (
  SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint AS clock
),
l AS MATERIALIZED (
  SELECT l.ord, l.key, l.calls, l.per, least(l.cost, l.calls) AS cost, l.caller,
         coalesce(l.at_ms, c.clock) AS clock
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5::text[], $6::bigint[])
         WITH ORDINALITY AS l(key, calls, per, cost, caller, at_ms, ord)
   CROSS JOIN c
),
d AS MATERIALIZED (
  SELECT l.ord, l.key, l.calls, l.cost,
         CASE WHEN bk.id IS NULL OR bk.fen OR l.per > bk.retain_ms
                   OR EXISTS (SELECT 1 FROM __SCHEMA__.line q WHERE q.bucket = l.key) THEN 'f'
              WHEN bk.total - (w.cum - w.cost) + l.cost > l.calls THEN
                CASE WHEN w.cum < bk.total + l.cost - l.calls THEN 'f'
                     WHEN th.until > greatest(l.clock, bk.floor_ms) AND th.until >= w.at + l.per THEN 't'
                     ELSE 'r' END
              WHEN th.until > greatest(l.clock, bk.floor_ms) THEN 't'
              WHEN bk.retain_ms > l.per OR bk.last_concurrent > 0
                   OR bk.last_at = greatest(l.clock, bk.floor_ms)
                   OR l.cost <= 0
                   OR (w.at IS NULL AND EXISTS (SELECT 1 FROM __SCHEMA__.ceilings ce WHERE ce.key = l.key))
                THEN 'f'
              ELSE 'g' END AS v,
         th.until, w.at + l.per AS rate_at, greatest(l.clock, bk.floor_ms) AS now,
         bk.xmin AS xm, bk.total, bk.last_seq
    FROM l
    LEFT JOIN __SCHEMA__.buckets bk ON bk.key = l.key
    LEFT JOIN LATERAL (
         SELECT g.at, g.cum, g.cost FROM __SCHEMA__.grants g
          WHERE g.bucket = bk.id
            AND g.at > greatest(bk.pruned_to, greatest(l.clock, bk.floor_ms) - bk.retain_ms,
                                greatest(l.clock, bk.floor_ms) - l.per)
          ORDER BY g.at LIMIT 1) w ON true
    LEFT JOIN __SCHEMA__.throttles th ON th.key = l.caller
),
p AS MATERIALIZED (
  SELECT DISTINCT ON (d.key) d.ord, d.key, d.calls, d.cost, d.now, d.xm, d.total, d.last_seq
    FROM d
   WHERE d.v = 'g'
   ORDER BY d.key, d.ord
),
k AS MATERIALIZED (
  SELECT bk.key
    FROM __SCHEMA__.buckets bk
    JOIN p ON p.key = bk.key
   WHERE bk.xmin = p.xm
   ORDER BY bk.key
     FOR NO KEY UPDATE OF bk SKIP LOCKED
),
u AS (
  UPDATE __SCHEMA__.buckets AS bk
     SET total = p.total + p.cost, last_seq = p.last_seq + 1, last_at = p.now,
         floor_ms = greatest(bk.floor_ms, p.now), last_calls = p.calls
    FROM p JOIN k ON k.key = p.key
   WHERE bk.key = p.key
  RETURNING bk.id, p.ord, p.now, p.total, p.cost, p.last_seq
),
i AS (
  INSERT INTO __SCHEMA__.grants (bucket, at, seq, cost, cum)
  SELECT u.id, u.now, u.last_seq + 1, u.cost, u.total + u.cost FROM u
)
SELECT d.ord,
       CASE WHEN d.v IN ('r', 't') THEN d.v WHEN u.ord IS NOT NULL THEN 'g' ELSE 'a' END AS v,
       d.until, d.rate_at, d.now
  FROM d
  LEFT JOIN u ON u.ord = d.ord
 ORDER BY d.ord
