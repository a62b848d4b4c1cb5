-- redb-limiter, PostgreSQL mode: the one statement that decides the most common request, an
-- acquire naming one window limit (no concurrency, no permit, no report, a cost above 0).
--
-- The server prepares it once per connection (`__SCHEMA__` stands for the quoted schema) and
-- sends it instead of a call of acquire(): one plain SELECT, with no plpgsql on the way to a
-- refusal. Each statement a plpgsql function runs costs PostgreSQL an executor start and the
-- set-up of every expression it evaluates again on every call (each call is its own
-- transaction); this one is planned once (a generic plan) and starts four index probes.
--
-- Parameters: $1 the bucket key, $2 calls, $3 perMs, $4 cost (as requested: capped at calls
-- here, as acquire() does), $5 the caller key, $6 at_ms (NULL: the database's clock),
-- $7 recheck_ms, $8 the request's holdMs, $9 the limit's holdMs.
--
-- It reads, in one snapshot and exactly as acquire() does: the bucket row, now (the clock
-- floored by the bucket), the first grant row of this request's window and the caller's
-- throttle. Then, per the verdict v:
--   't', 'r'  refused for the throttle (retryAt until) or for rate (retryAt rate_at, the first
--             row's leaving, when that row alone makes room): nothing locked, nothing written;
--   'g'       a grant: _acquire_window() writes it (the bucket row only if unchanged since the
--             read, and the grant row), and answers NULL; if the row changed meanwhile it
--             decides again through acquire() and answers that reply;
--   'f'       anything else (no such bucket, a bucket with a line (rule Q), a settled bucket, a retention this request would
--             lengthen or may restart, a place figure to keep, a grant in the same
--             millisecond as the bucket's newest, a rate retryAt past the first row, an empty
--             window with a ceiling row, which acquire() forgets first when it may go):
--             _acquire_window() answers with acquire()'s reply.
-- It answers one row: a non-NULL reply is acquire()'s reply; otherwise v, until, rate_at and
-- now are the decision.
SELECT x.v, x.until, x.rate_at, x.now,
       CASE WHEN x.v IN ('g', 'f') THEN
         __SCHEMA__._acquire_window(x.v = 'g', $1, $2::bigint, $3::bigint, $4::bigint, $5, $6::bigint,
                                    $7::bigint, $8::bigint, $9::bigint, x.xm, x.now, x.total, x.last_seq)
       END AS reply
  FROM (SELECT CASE WHEN bk.id IS NULL OR bk.fen OR $3::bigint > bk.retain_ms
                         OR EXISTS (SELECT 1 FROM __SCHEMA__.line q WHERE q.bucket = $1) THEN 'f'
                    WHEN bk.total - (w.cum - w.cost) + least($4::bigint, $2::bigint) > $2::bigint THEN
                      CASE WHEN w.cum < bk.total + least($4::bigint, $2::bigint) - $2::bigint THEN 'f'
                           WHEN th.until > greatest(c.clock, bk.floor_ms) AND th.until >= w.at + $3::bigint
                             THEN 't'
                           ELSE 'r' END
                    WHEN th.until > greatest(c.clock, bk.floor_ms) THEN 't'
                    WHEN bk.retain_ms > $3::bigint OR bk.last_concurrent > 0
                         OR bk.last_at = greatest(c.clock, bk.floor_ms)
                         OR least($4::bigint, $2::bigint) <= 0
                         OR (w.at IS NULL AND EXISTS (SELECT 1 FROM __SCHEMA__.ceilings ce WHERE ce.key = $1))
                      THEN 'f'
                    ELSE 'g' END AS v,
               th.until, w.at + $3::bigint AS rate_at, greatest(c.clock, bk.floor_ms) AS now,
               bk.xmin AS xm, bk.total, bk.last_seq
          FROM (SELECT coalesce($6::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                       AS clock) c
          LEFT JOIN __SCHEMA__.buckets bk ON bk.key = $1
          LEFT JOIN LATERAL (
               SELECT g.at, g.cum, g.cost FROM __SCHEMA__.grants g
                WHERE g.bucket = bk.id
                  AND g.at > greatest(bk.pruned_to, greatest(c.clock, bk.floor_ms) - bk.retain_ms,
                                      greatest(c.clock, bk.floor_ms) - $3::bigint)
                ORDER BY g.at LIMIT 1) w ON true
          LEFT JOIN __SCHEMA__.throttles th ON th.key = $5
        OFFSET 0) x
