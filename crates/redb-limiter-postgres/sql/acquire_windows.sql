-- redb-limiter, PostgreSQL mode: the one statement that decides an acquire naming two or more
-- window limits (none with concurrency, no permit, no report, every cost above 0), as
-- acquire_window.sql does for one. The server prepares it once per connection (`__SCHEMA__`
-- stands for the quoted schema) and sends it instead of a call of acquire().
--
-- Parameters, the arrays in request order: $1 the bucket keys, $2 calls, $3 perMs, $4 costs
-- (as requested: capped at calls here, as acquire() does), $5 the caller key, $6 at_ms (NULL:
-- the database's clock), $7 recheck_ms, $8 the request's holdMs, $9 the limits' holdMs.
--
-- It reads, in one snapshot and as _acquire_any() does: every bucket row, now (the clock
-- floored by every bucket's floor), the first grant row of each request window and the
-- caller's throttle. Then, per the verdict v:
--   'x'  refused: the latest retryAt (retry) of the throttle and of each limit whose first
--        window row alone makes room; on a tie the throttle, else the first limit in request
--        order. reason and lim name it. Nothing locked, nothing written;
--   'g'  a grant: _acquire_windows() locks the rows in key order and, if none changed since
--        the read, writes them and their grant rows and answers NULL; else it decides again
--        through acquire() and answers that reply;
--   'f'  anything else (a bucket that does not exist, a bucket with a line (rule Q), a settled one, retention to lengthen or
--        that may restart, a place figure to keep, a grant in a bucket's newest grant's
--        millisecond, a rate retryAt past a window's first row, an empty window with a ceiling
--        row, which acquire() forgets first when it may go): _acquire_windows() answers with
--        acquire()'s reply.
-- It answers one row: a non-NULL reply is acquire()'s reply; otherwise v, retry, reason, lim
-- and now are the decision.
WITH b AS MATERIALIZED (
  SELECT l.ord, l.key, l.calls, l.per, least(l.cost, l.calls) AS cost, bk.id, bk.xmin AS xm,
         bk.retain_ms, bk.pruned_to, bk.total, bk.fen, bk.last_seq, bk.last_at, bk.last_concurrent,
         bk.floor_ms
    FROM unnest($1::text[], $2::bigint[], $3::bigint[], $4::bigint[]) WITH ORDINALITY AS l(key, calls, per, cost, ord)
    LEFT JOIN __SCHEMA__.buckets bk ON bk.key = l.key
),
n AS MATERIALIZED (
  SELECT greatest(coalesce($6::bigint, floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint),
                  max(b.floor_ms)) AS now
    FROM b
),
r AS MATERIALIZED (
  SELECT b.*, n.now, w.at AS first_at, w.cum AS first_cum,
         coalesce(b.total - (w.cum - w.cost) + b.cost > b.calls, false) AS over
    FROM b CROSS JOIN n
    LEFT JOIN LATERAL (
         SELECT g.at, g.cum, g.cost FROM __SCHEMA__.grants g
          WHERE g.bucket = b.id AND g.at > greatest(b.pruned_to, n.now - b.retain_ms, n.now - b.per)
          ORDER BY g.at LIMIT 1) w ON true
),
a AS (
  SELECT bool_or(r.id IS NULL OR r.fen OR r.per > r.retain_ms
                 OR EXISTS (SELECT 1 FROM __SCHEMA__.line q WHERE q.bucket = r.key)
                 OR (r.over AND r.first_cum < r.total + r.cost - r.calls)) AS left_over,
         bool_and(r.retain_ms = r.per AND r.last_concurrent = 0 AND r.last_at IS DISTINCT FROM r.now
                  AND r.cost > 0
                  AND NOT (r.first_at IS NULL
                           AND EXISTS (SELECT 1 FROM __SCHEMA__.ceilings ce WHERE ce.key = r.key))) AS grantable,
         array_agg(r.id ORDER BY r.ord) AS ids, array_agg(r.xm ORDER BY r.ord) AS xms,
         array_agg(r.total ORDER BY r.ord) AS totals, array_agg(r.last_seq ORDER BY r.ord) AS seqs
    FROM r
),
s AS (
  SELECT x.retry, x.reason, x.lim
    FROM (SELECT th.until AS retry, 'throttle' AS reason, $5 AS lim, 0::bigint AS ord
            FROM __SCHEMA__.throttles th, n
           WHERE th.key = $5 AND th.until > n.now
          UNION ALL
          SELECT r.first_at + r.per, 'rate', r.key, r.ord FROM r WHERE r.over) x
   ORDER BY x.retry DESC, x.ord
   LIMIT 1
)
SELECT x.v, x.retry, x.reason, x.lim, x.now,
       CASE WHEN x.v IN ('g', 'f') THEN
         __SCHEMA__._acquire_windows(x.v = 'g', $1::text[], $2::bigint[], $3::bigint[], $4::bigint[], $5,
                                     $6::bigint, $7::bigint, $8::bigint, $9::bigint[], x.ids, x.xms, x.now,
                                     x.totals, x.seqs)
       END AS reply
  FROM (SELECT CASE WHEN a.left_over THEN 'f' WHEN s.retry IS NOT NULL THEN 'x'
                    WHEN a.grantable THEN 'g' ELSE 'f' END AS v,
               s.retry, s.reason, s.lim, n.now, a.ids, a.xms, a.totals, a.seqs
          FROM a CROSS JOIN n LEFT JOIN s ON true
        OFFSET 0) x
