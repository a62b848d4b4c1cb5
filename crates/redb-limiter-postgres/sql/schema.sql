-- redb-limiter, PostgreSQL mode: the schema and the functions that decide.
--
-- Format version 7. Every object lives in one schema, written __SCHEMA__ below; the server
-- replaces that placeholder with the quoted schema identifier (default "redb_limiter") before
-- running this script, which it does on first use and on `check`. The script is idempotent:
-- it creates what is missing, replaces the functions, and refuses (SQLSTATE RL001, naming the
-- version) a schema that carries another format version or that holds objects but no meta.
-- A schema of an earlier version is first brought to this one by the steps in migrate/
-- (version 1 to 2: migrate/1-2.sql; 2 to 3, the line: migrate/2-3.sql; 3 to 4, the line's
-- bounds of section 12.9: migrate/3-4.sql; 4 to 5, request ids of section 16: migrate/4-5.sql;
-- 5 to 6, token buckets of section 13: migrate/5-6.sql; 6 to 7, adaptive ceilings of section 14:
-- migrate/6-7.sql).
--
-- Keys and permit strings are stored escaped (the server's src/keys.rs): U+0000 as U+0001
-- U+0001 and U+0001 as U+0001 U+0002, so that every UTF-8 string a key may be is stored
-- (text and jsonb hold no U+0000), compared, ordered (COLLATE "C") and prefix-matched as the
-- string it stands for. These functions never look inside a key.
--
-- Time is whole milliseconds since the Unix epoch (bigint). The clock is the database's
-- (clock_timestamp()), floored per bucket so that it never runs backwards for a bucket.
-- Every function that reads the clock takes a last optional argument `at_ms` that replaces
-- the clock (tests drive instants with it; the server passes NULL).
--
-- Requests arrive validated and normalised (defaults filled in): these functions trust their
-- input's ranges and never answer a bad_request, except settle's key check, a ticket bound to
-- another request and a request id reused or released (RL400).
--
-- How a window is read (the tables are documented one by one below):
--   A bucket's grants are rows (bucket, at) in time order, one per millisecond (grants made in
--   the same millisecond are merged), each carrying `cum`, the running total of every cost ever
--   recorded in the bucket up to and including it. The cost counting in a window that starts
--   after instant `cut` is total - (cum - cost of the first row after cut): one index probe,
--   whatever the window's length. The retryAt of a rate refusal is when the first row whose cum
--   reaches total + cost - calls leaves. Running totals never decrease in time order, so that
--   row is found in time order, on the same index: usually it is the first row after cut,
--   which the window probe has just read; otherwise one statement reads the next 64 rows, and
--   a binary search over instants (O(log window) probes) goes on past them. (No index on cum:
--   every grant would maintain it, for the rare refusal that needs more than the first row.)
--   A settle changes a past grant's cost. Rewriting the running totals of every later row
--   would cost a write per later grant, so settle deltas live apart, in a Fenwick tree per
--   bucket indexed by the row's sequence number (table fen, sparse: only nodes ever touched
--   exist). The deltas of rows 1..k are the sum of at most log2(k) nodes, read in one
--   statement; a settle updates the nodes above its row up to the newest row, about
--   log2(rows granted since) upserts; a new row copies its node's share in one statement.
--   Buckets never settled skip all of it (buckets.fen is false). With deltas, the retryAt
--   search becomes a binary search over the window's rows (O(log window) probes).
--
-- How a bucket forgets (wire rule 3 and section 7):
--   retain_ms is the longest perMs named for the bucket while it was live; pruned_to is a
--   watermark below which grants no longer count. A grant at `at` counts for a request of
--   perMs P at `now` when at > greatest(pruned_to, now - retain_ms, now - P). When retention
--   grows at `now`, what the old retention had already let go stays gone
--   (pruned_to := now - old retention). A bucket whose window holds no cost and which holds
--   no place is idle, that is forgotten: the next write to it starts it afresh (retention 0,
--   watermark past every old grant), exactly as if its row had been deleted, which sweep()
--   then does.
--
-- Concurrency (safe under READ COMMITTED with any number of sessions and servers):
--   A decision first runs on snapshots with no lock. A refusal (or peek) that changes nothing
--   returns from there: no row lock, no transaction id, no WAL. A refusal that lengthens a
--   live bucket's retention (rule 3) locks and writes just that.
--   A grant that writes one existing bucket row writes it with UPDATE ... WHERE xmin = the
--   xmin it read: the UPDATE takes the row lock and, under READ COMMITTED, re-checks that
--   condition on the row's latest version, so it succeeds only if nobody wrote the row since,
--   and then the decision stands (every grant, settle and retention change writes the bucket
--   row; releases only free room; sweep deletes only what no decision can see). Otherwise
--   (a new bucket, a changed row, several buckets) the grant locks every bucket row it writes
--   in one order, sorted by key (INSERT ... ON CONFLICT DO UPDATE ... WHERE false creates a
--   missing row or locks the existing one), decides again on snapshots taken after the
--   locks, and writes. One order for every multi-row lock means no deadlock between acquires;
--   settle locks its permit row and then its buckets in the same key order.
--   An instant (now) is read before the rows it judges, so sweep() deletes nothing until
--   margin_ms (default 60 s) after it stopped counting.
--
-- Cost: statements are small and take scalar parameters: each costs microseconds, where one
-- statement joining everything would cost more to start than to run, and statements over
-- unnest() of array parameters would be planned again on every call. acquire() decides the
-- common case (one limit) itself with at most five index probes and one write statement;
-- _acquire_any() decides every request. The server sends an acquire of window limits only as
-- the one statement of acquire_window.sql (one limit) or acquire_windows.sql (several)
-- instead, beside this script: every statement a function runs costs an executor start on
-- every call, so those statements refuse with no plpgsql at all and call _acquire_window() or
-- _acquire_windows() (below) only to write a grant or to hand the request to acquire().
-- While requests are concurrent, the server decides the one-window acquires waiting at once
-- in one statement over arrays instead (acquire_window_batch.sql, beside this script), which
-- never waits for a lock and leaves to acquire_window.sql what it cannot decide so.
--
-- The line (wire section 12; tables tickets and line, below): acquire() is the entry of every
-- acquire and peek; a request that neither queues nor presents a ticket, naming no bucket with
-- a line, goes on to _acquire_plain() (what acquire() was before the line), every other one to
-- _acquire_line() (rule Q, filing, renewal, end). The one-statement paths and the batch leave a
-- bucket with a line to acquire(): one probe of the line's index, empty where nobody queues.

BEGIN;

SET LOCAL client_min_messages = warning;
SELECT pg_advisory_xact_lock(hashtext('redb-limiter schema __SCHEMA__'));

DO $check$
DECLARE
  v_ns oid := to_regnamespace('__SCHEMA__');
  v_version integer;
BEGIN
  IF v_ns IS NULL THEN
    RETURN;
  END IF;
  IF to_regclass('__SCHEMA__.meta') IS NULL THEN
    IF EXISTS (SELECT 1 FROM pg_class WHERE relnamespace = v_ns)
       OR EXISTS (SELECT 1 FROM pg_proc WHERE pronamespace = v_ns) THEN
      RAISE EXCEPTION 'schema __SCHEMA__ holds objects but no meta table: it is not a redb-limiter schema'
        USING ERRCODE = 'RL001';
    END IF;
    RETURN;
  END IF;
  EXECUTE 'SELECT max(version) FROM __SCHEMA__.meta' INTO v_version;
  IF v_version IS DISTINCT FROM 7 THEN
    RAISE EXCEPTION 'schema __SCHEMA__ carries redb-limiter format version %, this server knows version 7',
      coalesce(v_version::text, 'none')
      USING ERRCODE = 'RL001';
  END IF;
END
$check$;

CREATE SCHEMA IF NOT EXISTS __SCHEMA__;

-- One row: the format version of this schema, and sweep()'s place in the bucket keys.
CREATE TABLE IF NOT EXISTS __SCHEMA__.meta (
  one boolean PRIMARY KEY DEFAULT true CHECK (one),
  version integer NOT NULL,
  sweep_cursor text COLLATE "C" NOT NULL DEFAULT '',
  -- the latest instant a server was seen at (its sweeper's ticks): a server's start is a
  -- restart for the line (12.6) from here, or from the buckets' floors when later
  alive_at bigint NOT NULL DEFAULT 0,
  -- sweep()'s place in the token levels' keys (format 6; migrate/5-6.sql adds it)
  level_cursor text COLLATE "C" NOT NULL DEFAULT ''
);
INSERT INTO __SCHEMA__.meta (version) VALUES (7) ON CONFLICT DO NOTHING;
COMMENT ON TABLE __SCHEMA__.meta IS 'redb-limiter format version (one row), the sweep cursor and the latest instant seen';

-- A bucket: the row every grant into it locks, its retention and its running totals.
CREATE TABLE IF NOT EXISTS __SCHEMA__.buckets (
  key text COLLATE "C" PRIMARY KEY,           -- the bucket key (byte order: the lock order)
  id bigint GENERATED ALWAYS AS IDENTITY UNIQUE, -- compact key for grants, places and fen
  retain_ms bigint NOT NULL DEFAULT 0,         -- grants are kept this long (rule 3)
  pruned_to bigint NOT NULL DEFAULT -9223372036854775808, -- grants at or before it are gone
  dtotal bigint NOT NULL DEFAULT 0,            -- all settle deltas (the Fenwick tree's total)
  fen boolean NOT NULL DEFAULT false,          -- the Fenwick tree has nodes: read it
  last_calls bigint NOT NULL DEFAULT 0,        -- calls of the latest granted window (display)
  last_concurrent bigint NOT NULL DEFAULT 0,   -- concurrent of the latest granted place (display)
  -- what every grant changes, last and together (a smaller WAL record per update):
  total bigint NOT NULL DEFAULT 0,             -- cum of the newest grant row: all costs recorded
  last_seq bigint NOT NULL DEFAULT 0,          -- sequence number of the newest grant row
  last_at bigint,                              -- instant of the newest grant row
  floor_ms bigint NOT NULL DEFAULT 0,          -- the latest instant written: the clock floor
  queued bigint NOT NULL DEFAULT 0             -- rows of its line (tickets not yet ended, some
                                               -- perhaps lapsed): filing and ending a ticket
                                               -- change it under this row's lock
)
-- Every grant updates its bucket row: a few rows per page keep those updates HOT (no index
-- writes) and spread concurrent writers over many pages.
WITH (fillfactor = 50);
COMMENT ON TABLE __SCHEMA__.buckets IS
  'one row per bucket: its lock, retention (rule 3), running totals and clock floor';

-- A bucket's grants: one row per millisecond with grants, with the running total.
CREATE TABLE IF NOT EXISTS __SCHEMA__.grants (
  bucket bigint NOT NULL,  -- buckets.id
  at bigint NOT NULL,      -- the grant instant
  seq bigint NOT NULL,     -- 1, 2, 3 ... in the bucket, in time order: the Fenwick index
  cost bigint NOT NULL,    -- the costs granted at this instant, each capped at its calls
  cum bigint NOT NULL,     -- running total of cost in the bucket, this row included
  PRIMARY KEY (bucket, at)
);
-- (Earlier scripts indexed (bucket, cum, at) for the retryAt search; the search now runs on the
-- primary key, and every grant saves the index write.)
DROP INDEX IF EXISTS __SCHEMA__.grants_cum;
COMMENT ON TABLE __SCHEMA__.grants IS
  'window grants, merged per millisecond, with running totals (cum) for one-probe window sums';

-- Settle deltas: a sparse Fenwick tree per bucket over grants.seq.
CREATE TABLE IF NOT EXISTS __SCHEMA__.fen (
  bucket bigint NOT NULL,  -- buckets.id
  idx bigint NOT NULL,     -- Fenwick node: covers seq in (idx - lowbit(idx), idx]
  d bigint NOT NULL,       -- the sum of the settle deltas of the rows it covers
  PRIMARY KEY (bucket, idx)
);
COMMENT ON TABLE __SCHEMA__.fen IS
  'settle deltas per bucket as a sparse Fenwick tree over grants.seq';

-- Held concurrency places. A place is held while lapse > now and its permit is not released.
CREATE TABLE IF NOT EXISTS __SCHEMA__.places (
  bucket bigint NOT NULL,  -- buckets.id
  lapse bigint NOT NULL,   -- the place lapses at this instant unless released before
  permit text NOT NULL,    -- permits.id
  PRIMARY KEY (bucket, lapse, permit)
);
COMMENT ON TABLE __SCHEMA__.places IS 'concurrency places held, by bucket and lapse';

-- Permits: what release and settle need to find a grant again.
CREATE TABLE IF NOT EXISTS __SCHEMA__.permits (
  id text COLLATE "C" PRIMARY KEY, -- the opaque permit string the server generated
  at bigint NOT NULL,              -- the grant instant
  lapse bigint NOT NULL,           -- live while now < lapse: the last place's lapse, or
                                   -- at + holdMs when the request asked for a permit
  place_buckets bigint[] NOT NULL, -- the places held: buckets.id ...
  place_lapses bigint[] NOT NULL,  -- ... and their lapses, pairwise
  windows jsonb NOT NULL,          -- window limits of the grant, for settle:
                                   -- [{"k": key, "b": buckets.id, "calls", "per", "cost"}]
  adapted jsonb                    -- its adapted buckets (section 14; NULL: none), for an
                                   -- outcome: [{"k": key, "min", "max", "inc", "keep", "start",
                                   -- "per", "inPlay", "cuts": the ceiling's cuts at the grant,
                                   -- "sig": an outcome counted}] (format 7)
);
CREATE INDEX IF NOT EXISTS permits_lapse ON __SCHEMA__.permits (lapse);
COMMENT ON TABLE __SCHEMA__.permits IS 'live permits: places to free and window grants to settle';

-- Throttles: the caller key is refused while now < until.
CREATE TABLE IF NOT EXISTS __SCHEMA__.throttles (
  key text COLLATE "C" PRIMARY KEY,
  until bigint NOT NULL
);
CREATE INDEX IF NOT EXISTS throttles_until ON __SCHEMA__.throttles (until);
COMMENT ON TABLE __SCHEMA__.throttles IS 'caller throttles, in force while now < until';

-- The line (wire section 12). One sequence numbers every ticket of every bucket: the shared
-- counter, so an older ticket has a smaller number in every line it stands in.
CREATE SEQUENCE IF NOT EXISTS __SCHEMA__.ticket_numbers;
CREATE TABLE IF NOT EXISTS __SCHEMA__.tickets (
  num bigint PRIMARY KEY,            -- its number in the one counter (ticket_numbers)
  ticket text COLLATE "C" NOT NULL UNIQUE, -- the string the host holds: t- and 32 hex digits
  caller text COLLATE "C" NOT NULL,  -- the caller key it binds
  bound jsonb NOT NULL,              -- the limits it binds, defaults resolved, sorted by key
  keys text[] COLLATE "C" NOT NULL,  -- the buckets whose lines it stands in
  retry_at bigint NOT NULL,          -- the retryAt last given to it
  lapse_at bigint NOT NULL,          -- it lapses at this instant unless asked again before
  grace_ms bigint NOT NULL,          -- the graceMs it was last given
  filed_at bigint NOT NULL,          -- when it was filed
  deadline bigint NOT NULL,          -- it never lapses later (12.9): filed_at + its horizon, or
                                     -- a restart's lapse when later
  counted boolean NOT NULL DEFAULT false -- its lapse was counted (presented after it), so the
                                     -- sweeper that ends it does not count it again
);
CREATE INDEX IF NOT EXISTS tickets_lapse ON __SCHEMA__.tickets (lapse_at);
COMMENT ON TABLE __SCHEMA__.tickets IS 'live tickets of the line (section 12), one counter for all buckets';

-- Each bucket's line in order: one row per ticket and bucket it names, carrying what the
-- line's walk reads of the ticket (so the walk reads one index in order and nothing else). A
-- bucket with a line has a bucket row (its lock, and its line's count: buckets.queued).
CREATE TABLE IF NOT EXISTS __SCHEMA__.line (
  bucket text COLLATE "C" NOT NULL,  -- the bucket key
  num bigint NOT NULL,               -- tickets.num
  lapse_at bigint NOT NULL,          -- tickets.lapse_at
  caller text COLLATE "C" NOT NULL,  -- tickets.caller (a throttled ticket yields)
  calls bigint NOT NULL,             -- its limit here: calls (0: no window), perMs (0: none),
  per_ms bigint NOT NULL,            -- its cost capped at calls (0 without a window) and
  cost bigint NOT NULL,              -- concurrent (0: none); for a token bucket (section 13),
  conc bigint NOT NULL,              -- calls 0, its perMs, its cost capped at burst, and
  refill bigint NOT NULL DEFAULT 0,  -- its refill (0: no bucket), burst and initial
  burst bigint NOT NULL DEFAULT 0,
  initial bigint NOT NULL DEFAULT 0,
  -- a ticket whose limit here adapts (section 14; format 7): its [min, max] (NULL: it does
  -- not adapt) and its cost as asked; calls, cost, refill, burst and initial are then its own
  -- figures, and the walk judges them with the bucket's ceiling as it stands
  adapt_min bigint,
  adapt_max bigint,
  asked_cost bigint,
  PRIMARY KEY (bucket, num)
);
CREATE INDEX IF NOT EXISTS line_lapse ON __SCHEMA__.line (bucket, lapse_at);
COMMENT ON TABLE __SCHEMA__.line IS 'each bucket''s line: its tickets by number, oldest first';

-- Request ids (wire section 16): what an acquire a host named with "id" got, so that a retry is
-- answered as the first time and release {id} undoes it. A row is written by the acquire it
-- names, in its transaction (a grant, or a refusal that filed a ticket; any other refusal leaves
-- none), and by release {id}. It is remembered while until > now, and while the ticket it
-- names lives; sweep() forgets it after that. Only acquire_id() and undo() read it: an acquire
-- without an id never touches this table.
CREATE TABLE IF NOT EXISTS __SCHEMA__.requests (
  id text COLLATE "C" PRIMARY KEY,  -- the host's id (escaped, as keys are)
  params text NOT NULL,             -- the digest of the params a retry must repeat (32 hex
                                    -- digits, computed by the server; '' for an id released
                                    -- before its acquire arrived)
  until bigint NOT NULL,            -- remembered until then at least: 60 s after the acquire
                                    -- (or release), and no sooner than its permit's lapse
  outcome text NOT NULL CHECK (outcome IN ('g', 't', 'r')), -- granted, filed a ticket, released
  at bigint,                        -- g: the grant's instant
  permit text COLLATE "C",          -- g: its permit (NULL: none)
  windows jsonb,                    -- g without a permit: its window shares, as permits.windows
                                    -- keeps them but with no bucket id ("b")
  ticket text COLLATE "C",          -- t: the ticket filed ...
  retry_at bigint,                  -- ... and the refusal as it was answered
  reason text,
  lim text,
  lapse_at bigint
);
CREATE INDEX IF NOT EXISTS requests_until ON __SCHEMA__.requests (until);
COMMENT ON TABLE __SCHEMA__.requests IS 'request ids (section 16): what the acquire each names got';

-- Token buckets (wire section 13): a bucket key's level, as the engine's
-- engine/token_bucket.rs keeps it: `units` of 1/unit_ms of a token at the instant `at` (below 0
-- in debt), written under the figures refill per unit_ms up to burst, so a refill of `refill`
-- tokens per unit_ms adds exactly `refill` units a millisecond and no rounding accumulates.
-- forget_at is when it has stood full for its keeping time (an hour, or unit_ms when longer),
-- if nothing else happens: from then on, while its bucket holds no place and no kept grant, it
-- is forgotten (an acquire reads the request's initial), and sweep() deletes it, walking the
-- keys from a cursor (meta.level_cursor). No index but the key's: every grant rewrites its
-- row, and with no indexed column changed (and room on the page) that update is HOT. A level is
-- written only by a transaction that writes its bucket row (a grant only if that row is
-- unchanged since it read it, or under its lock; a settle and a refusal naming it under its
-- lock), and read after that row, so a decision never misses a level written since its read.
-- Arithmetic on levels is numeric: exact, as the engine's i128.
CREATE TABLE IF NOT EXISTS __SCHEMA__.levels (
  key text COLLATE "C" PRIMARY KEY,  -- the bucket key
  units bigint NOT NULL,             -- the level at `at`, in units of 1/unit_ms token
  unit_ms bigint NOT NULL,           -- the perMs of the figures that wrote it
  refill bigint NOT NULL,            -- the refill of the figures that wrote it
  burst bigint NOT NULL,             -- the burst of the figures that wrote it
  at bigint NOT NULL,                -- the instant it was written at
  forget_at bigint NOT NULL          -- full at, plus its keeping time
)
WITH (fillfactor = 50);
COMMENT ON TABLE __SCHEMA__.levels IS 'token bucket levels (section 13), exact, in units of 1/perMs token';

-- Adaptive ceilings (wire section 14; format 7): a bucket's ceiling C, shared by every host and
-- server that names the bucket with `adapt`, as the engine's engine/ceiling.rs keeps it. A
-- request is judged with C in place of its window's calls (a token bucket's refill, its burst
-- scaled) by _judged(); an outcome on a permit cuts or grows it in _signal(), under a
-- transaction lock on the key (in a key space of this schema's own, taken after the permit's
-- row lock), so two outcomes at once count one after the other. A row exists once an outcome
-- changed C. One at its max, or an hour past its latest signal, is forgotten with its bucket
-- (_kept_ceiling() reads it as none from then on; a grant or filing that brings the
-- bucket back deletes it first, and sweep() deletes the others).
CREATE TABLE IF NOT EXISTS __SCHEMA__.ceilings (
  key text COLLATE "C" PRIMARY KEY,  -- the bucket key
  c bigint NOT NULL,                 -- C
  max bigint NOT NULL,               -- the max of the latest request that signalled it
  cut_at bigint,                     -- the latest cut (NULL: none)
  cuts bigint NOT NULL,              -- cuts counted since it was kept (orders a grant and a cut
                                     -- in one millisecond: a permit keeps the count it saw)
  grown_at bigint,                   -- the latest growth (NULL: none)
  signal_at bigint NOT NULL          -- the latest outcome that counted
);
COMMENT ON TABLE __SCHEMA__.ceilings IS 'adaptive ceilings (section 14), one per bucket, shared by every server';

---------------------------------------------------------------------------------------------
-- Helpers.

-- The database clock in whole milliseconds since the Unix epoch (floored).
CREATE OR REPLACE FUNCTION __SCHEMA__._clock_ms() RETURNS bigint
LANGUAGE sql VOLATILE PARALLEL SAFE AS
$$ SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint $$;
COMMENT ON FUNCTION __SCHEMA__._clock_ms() IS 'the database clock in ms since the Unix epoch';

-- Fenwick nodes whose sum is the prefix 1..k: k, then k with its lowest set bit cleared, ...
CREATE OR REPLACE FUNCTION __SCHEMA__._fen_down(k bigint) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS
$$
DECLARE
  a bigint[] := '{}';
BEGIN
  WHILE k > 0 LOOP
    a := a || k;
    k := k & (k - 1);
  END LOOP;
  RETURN a;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._fen_down(bigint) IS 'Fenwick nodes summing the prefix 1..k';

-- Fenwick nodes that cover row k, up to node n: k, k + lowbit(k), ...
CREATE OR REPLACE FUNCTION __SCHEMA__._fen_up(k bigint, n bigint) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS
$$
DECLARE
  a bigint[] := '{}';
BEGIN
  WHILE k >= 1 AND k <= n LOOP
    a := a || k;
    k := k + (k & -k);
  END LOOP;
  RETURN a;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._fen_up(bigint, bigint) IS 'Fenwick nodes covering row k, up to n';

-- The settle deltas of a bucket's rows with seq 1..k.
CREATE OR REPLACE FUNCTION __SCHEMA__._fen_sum(p_bucket bigint, k bigint) RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE AS
$$
  SELECT coalesce(sum(f.d), 0)::bigint FROM __SCHEMA__.fen f
   WHERE f.bucket = p_bucket AND f.idx = ANY (__SCHEMA__._fen_down(k))
$$;
COMMENT ON FUNCTION __SCHEMA__._fen_sum(bigint, bigint) IS 'settle deltas of rows 1..k of a bucket';

-- The cost counting in a bucket for grants made after `cut` (one probe, plus one Fenwick read
-- when the bucket was ever settled).
CREATE OR REPLACE FUNCTION __SCHEMA__._used(p_bucket bigint, p_cut bigint, p_total bigint,
                                            p_dtotal bigint, p_fen boolean) RETURNS bigint
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  v_seq bigint;
  v_before bigint;
BEGIN
  SELECT g.seq, g.cum - g.cost INTO v_seq, v_before
    FROM __SCHEMA__.grants g
   WHERE g.bucket = p_bucket AND g.at > p_cut
   ORDER BY g.at
   LIMIT 1;
  IF NOT FOUND THEN
    RETURN 0;
  END IF;
  IF p_fen THEN
    RETURN p_total + p_dtotal - v_before - __SCHEMA__._fen_sum(p_bucket, v_seq - 1);
  END IF;
  RETURN p_total - v_before;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._used(bigint, bigint, bigint, bigint, boolean) IS
  'cost counting in a bucket for grants after cut';

-- True when the bucket is idle at p_now: no cost in its kept window and no place held.
CREATE OR REPLACE FUNCTION __SCHEMA__._idle(p_bucket bigint, p_now bigint, p_retain bigint,
                                            p_pruned bigint, p_total bigint, p_dtotal bigint,
                                            p_fen boolean) RETURNS boolean
LANGUAGE plpgsql STABLE AS
$$
BEGIN
  -- A kept grant row keeps the bucket, whatever its cost: a permit's grant of cost 0 (or
  -- settled to 0) may still be settled up, as the engine keeps it.
  IF p_retain > 0 AND EXISTS (SELECT 1 FROM __SCHEMA__.grants g
                               WHERE g.bucket = p_bucket AND g.at > greatest(p_pruned, p_now - p_retain)) THEN
    RETURN false;
  END IF;
  RETURN NOT EXISTS (SELECT 1 FROM __SCHEMA__.places p
                      WHERE p.bucket = p_bucket AND p.lapse > p_now);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._idle(bigint, bigint, bigint, bigint, bigint, bigint, boolean) IS
  'a bucket with no grant in its kept window and no place held is idle (forgotten)';

-- retryAt of a rate refusal: the instant the first grant row leaves whose leaving makes room,
-- that is the first row after p_cut whose running total (deltas included) reaches p_target.
-- Running totals (deltas included) never decrease in time order, and the newest row always
-- qualifies (a capped cost fits an empty window): without deltas the next 64 rows are read in
-- one statement, then (and with deltas from the start) a binary search over instants.
CREATE OR REPLACE FUNCTION __SCHEMA__._rate_retry(p_bucket bigint, p_cut bigint, p_target bigint,
                                                  p_per bigint, p_fen boolean, p_last_at bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  v_at bigint;
  v_seq bigint;
  v_cum bigint;
  v_lo bigint;
  v_hi bigint;
  v_mid bigint;
  v_ans bigint;
BEGIN
  IF NOT p_fen THEN
    -- The usual answer is among the first rows: read 64 in one statement.
    SELECT min(s.at) FILTER (WHERE s.cum >= p_target), max(s.at) INTO v_ans, v_lo
      FROM (SELECT g.at, g.cum FROM __SCHEMA__.grants g
             WHERE g.bucket = p_bucket AND g.at > p_cut ORDER BY g.at LIMIT 64) s;
    IF v_ans IS NOT NULL THEN
      RETURN v_ans + p_per;
    END IF;
    v_lo := v_lo + 1;  -- search the rows after those 64
  ELSE
    SELECT g.at INTO v_lo FROM __SCHEMA__.grants g
     WHERE g.bucket = p_bucket AND g.at > p_cut ORDER BY g.at LIMIT 1;
  END IF;
  v_ans := p_last_at;
  v_hi := p_last_at;  -- search the rows in [v_lo, v_hi) for an earlier one
  WHILE v_lo < v_hi LOOP
    v_mid := v_lo + (v_hi - v_lo) / 2;
    SELECT g.at, g.seq, g.cum INTO v_at, v_seq, v_cum FROM __SCHEMA__.grants g
     WHERE g.bucket = p_bucket AND g.at >= v_mid AND g.at < v_hi
     ORDER BY g.at LIMIT 1;
    IF NOT FOUND THEN
      v_hi := v_mid;
    ELSIF (v_cum + CASE WHEN p_fen THEN __SCHEMA__._fen_sum(p_bucket, v_seq) ELSE 0 END) >= p_target THEN
      v_ans := v_at;
      v_hi := v_at;
    ELSE
      v_lo := v_at + 1;
    END IF;
  END LOOP;
  RETURN v_ans + p_per;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._rate_retry(bigint, bigint, bigint, bigint, boolean, bigint) IS
  'retryAt of a rate refusal: when enough of the oldest grants have left the window';

-- Token levels (wire section 13), the engine's engine/token_bucket.rs rule for rule. A level is
-- passed as an array {units, unit_ms, refill, burst, at} (see table levels), NULL for none (a
-- bucket never named, or forgotten: an acquire reads it at the request's initial); a request's
-- figures as refill, per (its perMs), burst and initial. Arithmetic is numeric: exact.

-- (These helpers are plpgsql, whose expressions keep their plans between calls: a SQL function
-- that the planner does not inline is planned again at every call.)

-- a / b rounded towards minus infinity, and a / b rounded up (a >= 0), for b > 0.
CREATE OR REPLACE FUNCTION __SCHEMA__._floor_div(a numeric, b numeric) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS
$$ BEGIN RETURN CASE WHEN a < 0 AND mod(a, b) <> 0 THEN div(a, b) - 1 ELSE div(a, b) END; END $$;

CREATE OR REPLACE FUNCTION __SCHEMA__._ceil_div(a numeric, b numeric) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS
$$ BEGIN RETURN div(a + b - 1, b); END $$;

-- A numeric held in a bigint, clamped (a level is bounded far inside it: burst x perMs either
-- side of 0).
CREATE OR REPLACE FUNCTION __SCHEMA__._to_bigint(a numeric) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE AS
$$ BEGIN RETURN greatest(least(a, 9223372036854775807), -9223372036854775808)::bigint; END $$;

-- The level l at p_now read with the figures (p_refill, p_per, p_burst), in units of 1/p_per
-- token (BucketLevel::units_at): the units kept, in those units (rounded down when l was
-- written under another perMs: never fuller than it was), refilled since l.at up to burst; a
-- level already above that burst (written under a larger one) is neither refilled nor cut.
-- No level: p_initial tokens (level_units).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_units(l bigint[], p_refill bigint, p_per bigint, p_burst bigint,
                                                p_initial bigint, p_now bigint) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
DECLARE
  v_base numeric;
  v_cap numeric := p_burst::numeric * p_per;
BEGIN
  IF l IS NULL THEN
    RETURN p_initial::numeric * p_per;
  END IF;
  v_base := CASE WHEN l[2] = p_per THEN l[1]::numeric
                 ELSE __SCHEMA__._floor_div(l[1]::numeric * p_per, l[2]) END;
  IF v_base >= v_cap THEN
    RETURN v_base;
  END IF;
  RETURN least(v_base + p_refill::numeric * greatest(p_now - l[5], 0), v_cap);
END
$$;

-- The level of p_units (in units of 1/p_per token) at p_at, written under (p_refill, p_per,
-- p_burst).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_of(p_units numeric, p_refill bigint, p_per bigint, p_burst bigint,
                                             p_at bigint) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$ BEGIN RETURN ARRAY[__SCHEMA__._to_bigint(p_units), p_per, p_refill, p_burst, p_at]; END $$;

-- Whether the figures (p_per, p_burst) read l above their burst (written under a larger one).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_above(l bigint[], p_per bigint, p_burst bigint) RETURNS boolean
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
BEGIN
  RETURN l IS NOT NULL
         AND CASE WHEN l[2] = p_per THEN l[1]::numeric
                  ELSE __SCHEMA__._floor_div(l[1]::numeric * p_per, l[2]) END > p_burst::numeric * p_per;
END
$$;

-- Rule B at p_now for a cost of p_cost: NULL when it fits, else the earliest whole millisecond
-- at which the level, refilling, reaches min(cost, burst) (refused_until). A cost of 0 fits.
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_retry(l bigint[], p_refill bigint, p_per bigint, p_burst bigint,
                                                p_initial bigint, p_cost bigint, p_now bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
DECLARE
  v_units numeric;
  v_need numeric := least(p_cost, p_burst)::numeric * p_per;
BEGIN
  IF p_cost <= 0 THEN
    RETURN NULL;
  END IF;
  v_units := __SCHEMA__._lv_units(l, p_refill, p_per, p_burst, p_initial, p_now);
  IF v_units >= v_need THEN
    RETURN NULL;
  END IF;
  RETURN __SCHEMA__._to_bigint(p_now + __SCHEMA__._ceil_div(v_need - v_units, p_refill));
END
$$;

-- The level after a grant of p_cost at p_now (rule B checked): min(cost, burst) taken at the
-- grant's instant. A level above the request's burst (written under a larger one, or before a
-- cut of its ceiling) is taken from as read, not refilled, and kept under the figures that
-- wrote it (take).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_take(l bigint[], p_refill bigint, p_per bigint, p_burst bigint,
                                               p_initial bigint, p_cost bigint, p_now bigint) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
BEGIN
  IF __SCHEMA__._lv_above(l, p_per, p_burst) THEN
    RETURN __SCHEMA__._lv_of(l[1]::numeric - least(p_cost, p_burst)::numeric * l[2], l[3], l[2], l[4], p_now);
  END IF;
  RETURN __SCHEMA__._lv_of(__SCHEMA__._lv_units(l, p_refill, p_per, p_burst, p_initial, p_now)
                           - least(p_cost, p_burst)::numeric * p_per, p_refill, p_per, p_burst, p_now);
END
$$;

-- The level after a settle at p_now of a grant made with (p_refill, p_per, p_burst) whose cost
-- goes from p_old to p_new (each capped at burst): the difference goes back (never above
-- burst, nor a level already above it cut) or is taken (the level may fall below 0). No level:
-- a forgotten bucket was full (settle).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_settle(l bigint[], p_refill bigint, p_per bigint, p_burst bigint,
                                                 p_old bigint, p_new bigint, p_now bigint) RETURNS bigint[]
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
DECLARE
  v_old numeric := least(p_old, p_burst);
  v_new numeric := least(p_new, p_burst);
  v_cap numeric := p_burst::numeric * p_per;
  v_units numeric;
BEGIN
  IF __SCHEMA__._lv_above(l, p_per, p_burst) THEN
    RETURN __SCHEMA__._lv_of(l[1]::numeric - greatest(v_new - v_old, 0) * l[2], l[3], l[2], l[4], p_now);
  END IF;
  v_units := CASE WHEN l IS NULL THEN v_cap ELSE __SCHEMA__._lv_units(l, p_refill, p_per, p_burst, p_burst, p_now) END;
  v_units := CASE WHEN v_new < v_old THEN greatest(v_units, least(v_units + (v_old - v_new) * p_per, v_cap))
                  ELSE v_units - (v_new - v_old) * p_per END;
  RETURN __SCHEMA__._lv_of(v_units, p_refill, p_per, p_burst, p_now);
END
$$;

-- The level in whole tokens at p_now (rounded down; negative in debt) as the figures that wrote
-- it read it: what /state shows.
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_tokens(l bigint[], p_now bigint) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$ BEGIN RETURN __SCHEMA__._floor_div(__SCHEMA__._lv_units(l, l[3], l[2], l[4], l[4], p_now), l[2])::bigint; END $$;

-- When l has stood full for its keeping time under the figures that wrote it, if nothing else
-- happens (forget_at): full at, plus an hour or its perMs when longer (kept_full_ms).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_forget_at(l bigint[]) RETURNS bigint
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS
$$
BEGIN
  RETURN __SCHEMA__._to_bigint(l[5]::numeric
           + greatest(__SCHEMA__._ceil_div(greatest(l[4]::numeric * l[2] - l[1], 0), l[3]), 0)
           + greatest(l[2], 3600000));
END
$$;

-- The level of bucket p_key at p_now, NULL when there is none or it is forgotten: it stood full
-- for its keeping time and its bucket holds no place and no kept grant.
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_live(p_key text, p_now bigint) RETURNS bigint[]
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  l record;
  b record;
BEGIN
  SELECT lv.units, lv.unit_ms, lv.refill, lv.burst, lv.at, lv.forget_at INTO l
    FROM __SCHEMA__.levels lv WHERE lv.key = p_key;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF l.forget_at <= p_now THEN
    SELECT bk.id, bk.retain_ms, bk.pruned_to INTO b FROM __SCHEMA__.buckets bk WHERE bk.key = p_key;
    IF NOT FOUND OR __SCHEMA__._idle(b.id, p_now, b.retain_ms, b.pruned_to, 0, 0, false) THEN
      RETURN NULL;
    END IF;
  END IF;
  RETURN ARRAY[l.units, l.unit_ms, l.refill, l.burst, l.at];
END
$$;

-- Writes bucket p_key's level (its transaction writes or holds the bucket row: see levels).
CREATE OR REPLACE FUNCTION __SCHEMA__._lv_write(p_key text, l bigint[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS
$$
BEGIN
  INSERT INTO __SCHEMA__.levels AS lv (key, units, unit_ms, refill, burst, at, forget_at)
  VALUES (p_key, l[1], l[2], l[3], l[4], l[5], __SCHEMA__._lv_forget_at(l))
  ON CONFLICT (key) DO UPDATE
     SET units = excluded.units, unit_ms = excluded.unit_ms, refill = excluded.refill,
         burst = excluded.burst, at = excluded.at, forget_at = excluded.forget_at;
END
$$;

-- The ceiling kept for bucket p_key at p_now (section 14), NULL when none is: a ceiling at its
-- max, or an hour past its latest signal, is forgotten with its bucket (no grant kept, no place
-- held, no line and no token level live), as the engine forgets it, whether or not sweep() has
-- deleted its row yet.
CREATE OR REPLACE FUNCTION __SCHEMA__._kept_ceiling(p_key text, p_now bigint)
RETURNS __SCHEMA__.ceilings
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  ce __SCHEMA__.ceilings;
  b record;
BEGIN
  SELECT * INTO ce FROM __SCHEMA__.ceilings x WHERE x.key = p_key;
  IF NOT FOUND THEN
    RETURN NULL;
  END IF;
  IF ce.c < ce.max AND ce.signal_at + 3600000 > p_now THEN
    RETURN ce;
  END IF;
  SELECT bk.id, bk.retain_ms, bk.pruned_to, bk.total, bk.dtotal, bk.fen, bk.queued INTO b
    FROM __SCHEMA__.buckets bk WHERE bk.key = p_key;
  IF FOUND AND ((b.queued > 0 AND __SCHEMA__._queued(p_key, p_now) > 0)
                OR NOT __SCHEMA__._idle(b.id, p_now, b.retain_ms, b.pruned_to, b.total, b.dtotal, b.fen)) THEN
    RETURN ce;
  END IF;
  IF __SCHEMA__._lv_live(p_key, p_now) IS NOT NULL THEN
    RETURN ce;
  END IF;
  RETURN NULL;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._kept_ceiling(text, bigint) IS
  'the ceiling kept for a bucket (section 14), NULL once it is forgotten with its bucket';

-- Section 14: req as it is judged. Each limit with "adapt" gets its bucket's ceiling C (table
-- ceilings; none kept: its own calls, or refill) clamped to its own [min, max] in place of its
-- window's calls, or of its token bucket's refill, with burst scaled to floor(burst x C /
-- refill) (at least 1) and initial at most that; its own figures are kept beside them in
-- "adaptOwn" (so _bound() binds a ticket to what the host asked, and judging again starts from
-- them) and the ceiling's count of cuts in "ceilingCuts" (what a permit keeps of the grant).
-- Every other request comes back as it is, after one containment test. The engine's
-- Engine::judged.
CREATE OR REPLACE FUNCTION __SCHEMA__._judged(req jsonb, p_now bigint) RETURNS jsonb
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  e jsonb;
  v_own jsonb;
  v_limits jsonb := '[]';
  v_start bigint;
  v_kc bigint;
  v_cuts bigint;
  v_c bigint;
  v_burst bigint;
BEGIN
  IF NOT coalesce(req->'limits' @> '[{"adapt": {}}]', false) THEN
    RETURN req;
  END IF;
  FOR e IN SELECT x.v FROM jsonb_array_elements(req->'limits') WITH ORDINALITY AS x(v, ord) ORDER BY x.ord LOOP
    IF e ? 'adapt' THEN
      v_own := coalesce(e->'adaptOwn', jsonb_strip_nulls(jsonb_build_object(
        'calls', e->'calls', 'refill', e->'refill', 'burst', e->'burst', 'initial', e->'initial')));
      e := e - 'adaptOwn' - 'ceilingCuts' || v_own;
      v_start := coalesce((v_own->>'calls')::bigint, (v_own->>'refill')::bigint);
      v_kc := NULL;
      v_cuts := NULL;
      SELECT ce.c, ce.cuts INTO v_kc, v_cuts FROM __SCHEMA__._kept_ceiling(e->>'key', p_now) ce;
      v_c := least(greatest(coalesce(v_kc, v_start), (e->'adapt'->>'min')::bigint), (e->'adapt'->>'max')::bigint);
      e := e || jsonb_build_object('adaptOwn', v_own, 'ceilingCuts', coalesce(v_cuts, 0));
      IF e ? 'calls' THEN
        e := e || jsonb_build_object('calls', v_c);
      ELSIF e ? 'refill' THEN
        v_burst := greatest(1, div(coalesce((v_own->>'burst')::numeric, v_start) * v_c, v_start))::bigint;
        e := e || jsonb_build_object('refill', v_c, 'burst', v_burst,
                                     'initial', least(coalesce((v_own->>'initial')::bigint, v_burst), v_burst));
      END IF;
    END IF;
    v_limits := v_limits || jsonb_build_array(e);
  END LOOP;
  RETURN jsonb_set(req, '{limits}', v_limits);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._judged(jsonb, bigint) IS
  'a request as section 14 judges it: each adapted limit with its bucket''s ceiling';

-- One limit's figures as in spec 9.1: used/remaining for a window, held/free for places.
CREATE OR REPLACE FUNCTION __SCHEMA__._figure(p_key text, p_calls bigint, p_conc bigint,
                                              p_used bigint, p_held bigint)
RETURNS jsonb
LANGUAGE sql IMMUTABLE AS
$$
  SELECT jsonb_build_object('key', p_key)
         || CASE WHEN p_calls IS NULL THEN '{}'::jsonb
                 ELSE jsonb_build_object('used', p_used, 'remaining', greatest(p_calls - p_used, 0)) END
         || CASE WHEN p_conc IS NULL THEN '{}'::jsonb
                 ELSE jsonb_build_object('held', p_held, 'free', greatest(p_conc - p_held, 0)) END
$$;
COMMENT ON FUNCTION __SCHEMA__._figure(text, bigint, bigint, bigint, bigint) IS
  'one limit''s figures (used/remaining, held/free) as in spec 9.1';

-- A refusal that names a live bucket with a longer perMs than its retention lengthens it
-- (rule 3), and one that names a token bucket with no level, whose initial is below its burst,
-- creates its level at initial (section 13; a full one is what a bucket never named reads
-- anyway): the rows are locked in key order (a token bucket's created if missing), checked
-- again under the lock, and written.
CREATE OR REPLACE FUNCTION __SCHEMA__._lengthen(req jsonb, p_now bigint, at_ms bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  b record;
  x record;
  v_now bigint;
BEGIN
  FOR x IN SELECT y.key, y."perMs" AS per, y.refill, coalesce(y.burst, y.refill) AS burst,
                  coalesce(y.initial, y.burst, y.refill) AS initial
             FROM jsonb_to_recordset(coalesce(req->'limits', '[]'))
                  AS y(key text, "perMs" bigint, refill bigint, burst bigint, initial bigint)
            WHERE y."perMs" IS NOT NULL
            ORDER BY y.key COLLATE "C" LOOP
    IF x.refill IS NOT NULL THEN
      CONTINUE WHEN x.initial >= x.burst OR __SCHEMA__._lv_live(x.key, p_now) IS NOT NULL;
      INSERT INTO __SCHEMA__.buckets AS bk (key) VALUES (x.key)
      ON CONFLICT (key) DO UPDATE SET key = excluded.key WHERE false;
      SELECT greatest(p_now, bk.floor_ms) INTO v_now FROM __SCHEMA__.buckets bk WHERE bk.key = x.key;
      CONTINUE WHEN __SCHEMA__._lv_live(x.key, v_now) IS NOT NULL;
      PERFORM __SCHEMA__._lv_write(x.key, __SCHEMA__._lv_of(x.initial::numeric * x.per, x.refill, x.per,
                                                            x.burst, v_now));
      UPDATE __SCHEMA__.buckets SET floor_ms = greatest(floor_ms, v_now) WHERE key = x.key;
      CONTINUE;
    END IF;
    SELECT bk.* INTO b FROM __SCHEMA__.buckets bk WHERE bk.key = x.key AND x.per > bk.retain_ms FOR UPDATE;
    -- (a bucket deleted meanwhile was idle: nothing to keep)
    CONTINUE WHEN NOT FOUND;
    v_now := greatest(p_now, coalesce(at_ms, __SCHEMA__._clock_ms()), b.floor_ms);
    CONTINUE WHEN __SCHEMA__._idle(b.id, v_now, b.retain_ms, b.pruned_to, b.total, b.dtotal, b.fen);
    UPDATE __SCHEMA__.buckets
       SET retain_ms = x.per,
           pruned_to = CASE WHEN b.retain_ms > 0 THEN greatest(b.pruned_to, v_now - b.retain_ms)
                            ELSE b.pruned_to END,
           floor_ms = v_now
     WHERE id = b.id;
  END LOOP;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._lengthen(jsonb, bigint, bigint) IS
  'a refusal lengthens the retention of the live buckets it names with a longer perMs';

---------------------------------------------------------------------------------------------
-- acquire / report / peek: _acquire_any decides any request; acquire (below) is the entry
-- point and decides the common case with fewer statements.
--
-- req:  {"key": caller, "holdMs": n, "permit": bool,
--        "limits": [{"key", "calls"?, "refill"?, "perMs"?, "burst"?, "initial"?, "concurrent"?,
--                    "cost", "holdMs"}]}
--       (validated, defaults filled in; a limit's cost and holdMs may also be left out, then
--        the request's cost (default 1) and holdMs (default 600000) apply; a limit with refill
--        is a token bucket, section 13, whose level lives in table levels)
-- mode: 'acquire', 'report' (acquire + now + figures) or 'peek' (decide, change nothing)
-- recheck_ms: a concurrency refusal's retryAt is at most now + recheck_ms
-- permit_id:  used only on a grant that holds a place or whose request asked for a permit
-- Returns, granted: {"granted": true, "at", "permit": id|null, "now"[, "limits"]}
--          refused: {"granted": false, "retryAt", "reason", "limit", "now"[, "limits"]}
--          peek:    {"fits": true|false[, "retryAt", "reason", "limit"], "now", "limits"}
--
-- Pass 1 decides on a snapshot, without locks: per limit one read of the bucket row, one probe
-- of its window (which also finds the rate retryAt) and one of its places (for a token bucket,
-- one read of its level, after the bucket rows), plus the caller's throttle. A refusal or peek returns from there: it reads, locks nothing, writes nothing.
-- A grant that writes one existing bucket row writes it with UPDATE ... WHERE xmin = the
-- snapshot's: the UPDATE takes the row lock and, under READ COMMITTED, re-checks the
-- condition on the row's latest version, so it succeeds only when nobody changed the row
-- since the snapshot and the snapshot's decision stands; then it inserts the grant row.
-- Otherwise (a new bucket, several buckets, a concurrent change) it locks every row it writes
-- in key order, creating missing ones, and pass 2 decides again on a snapshot taken after the
-- locks, then writes. (Statements are small and take scalar parameters only: each costs a
-- few microseconds, where one statement joining everything would cost more to start than to
-- run.)
CREATE OR REPLACE FUNCTION __SCHEMA__._acquire_any(req jsonb, mode text, recheck_ms bigint,
                                              permit_id text, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_caller text := req->>'key';
  v_figures boolean := mode <> 'acquire';
  v_line_decided boolean := req ? 'lineDecided';
  v_limits jsonb := req->'limits';
  n integer;
  i integer;
  j integer;
  e jsonb;
  -- the request, per limit
  lk text[]; lcalls bigint[]; lper bigint[]; lconc bigint[]; lcost bigint[]; lhold bigint[];
  v_any_conc boolean := false;
  -- a token bucket's figures (lref NULL: no bucket), its perMs (lper is NULL then: no window),
  -- its cost capped at burst, and its level as read (text of the level's array; NULL: none)
  lref bigint[]; lbper bigint[]; lburst bigint[]; linit bigint[]; ltok bigint[]; llv text[];
  v_lv bigint[];
  -- the limit adapts (section 14: judged already, see _judged), and the permit's shares
  lad boolean[];
  v_adapted jsonb := '[]';
  v_in_play boolean;
  v_name boolean;
  -- the bucket rows read, per limit (bid NULL: no such bucket)
  b record;
  bid bigint[]; br bigint[]; bw bigint[]; btot bigint[]; bdtot bigint[]; bfen boolean[];
  bseq bigint[]; blast bigint[]; bcalls bigint[]; bconc bigint[]; bxm text[];
  used bigint[]; held bigint[]; grow boolean[];
  v_until bigint;
  v_clock bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_now bigint;
  v_locked boolean := false;  -- the rows to write are locked (pass 2)
  -- the decision
  v_refused boolean;
  v_retry bigint;
  v_reason text;
  v_lim text;
  v_at bigint;
  v_rate bigint;
  v_used bigint;
  v_grow boolean;
  v_fig jsonb;
  v_reply jsonb;
  -- the writes
  v_permit text;
  v_need boolean[];
  v_keys text[];
  v_nneed integer;
  v_one integer;
  v_key text;
  v_reset boolean;
  v_r bigint; v_w bigint; v_seq bigint; v_d bigint; v_calls bigint; v_conc bigint;
  v_rows integer;
  v_windows jsonb;
  p_bid bigint[]; p_lapse bigint[];
  v_lapse bigint;
BEGIN
  IF mode NOT IN ('acquire', 'report', 'peek') THEN
    RAISE EXCEPTION 'mode must be acquire, report or peek, not %', mode USING ERRCODE = '22023';
  END IF;
  n := coalesce(jsonb_array_length(v_limits), 0);
  FOR i IN 1 .. n LOOP
    e := v_limits->(i - 1);
    lk[i] := e->>'key';
    lcalls[i] := (e->>'calls')::bigint;
    lper[i] := (e->>'perMs')::bigint;
    lconc[i] := (e->>'concurrent')::bigint;
    lcost[i] := CASE WHEN lcalls[i] IS NULL THEN 0
                     ELSE least(coalesce((e->>'cost')::bigint, (req->>'cost')::bigint, 1), lcalls[i]) END;
    lhold[i] := coalesce((e->>'holdMs')::bigint, (req->>'holdMs')::bigint, 600000);
    v_any_conc := v_any_conc OR lconc[i] IS NOT NULL;
    lad[i] := e ? 'adapt';
    lref[i] := (e->>'refill')::bigint;
    ltok[i] := 0;
    IF lref[i] IS NOT NULL THEN
      lbper[i] := lper[i];
      lper[i] := NULL;
      lburst[i] := coalesce((e->>'burst')::bigint, lref[i]);
      linit[i] := coalesce((e->>'initial')::bigint, lburst[i]);
      ltok[i] := least(coalesce((e->>'cost')::bigint, (req->>'cost')::bigint, 1), lburst[i]);
    END IF;
  END LOOP;

  FOR v_pass IN 1 .. 2 LOOP
    -- The rows, then the clock: now is the latest of the clock and the buckets' floors.
    v_now := v_clock;
    FOR i IN 1 .. n LOOP
      SELECT bk.id, bk.retain_ms, bk.pruned_to, bk.total, bk.dtotal, bk.fen, bk.last_seq,
             bk.last_at, bk.last_calls, bk.last_concurrent, bk.floor_ms, bk.queued, bk.xmin::text AS xm
        INTO b FROM __SCHEMA__.buckets bk WHERE bk.key = lk[i];
      IF FOUND AND b.queued > 0 AND NOT v_line_decided THEN
        -- A bucket with a line (read with the row, so a grant written only if the row is
        -- unchanged, or under its lock, never misses a ticket filed before it): rule Q decides.
        RETURN __SCHEMA__._acquire_line(req, mode, recheck_ms, permit_id, at_ms);
      END IF;
      IF FOUND THEN
        bid[i] := b.id; br[i] := b.retain_ms; bw[i] := b.pruned_to; btot[i] := b.total;
        bdtot[i] := b.dtotal; bfen[i] := b.fen; bseq[i] := b.last_seq; blast[i] := b.last_at;
        bcalls[i] := b.last_calls; bconc[i] := b.last_concurrent; bxm[i] := b.xm;
        v_now := greatest(v_now, b.floor_ms);
      ELSE
        bid[i] := NULL;
      END IF;
    END LOOP;
    SELECT th.until INTO v_until FROM __SCHEMA__.throttles th WHERE th.key = v_caller;

    -- The refusal that stands: the latest retryAt; on a tie the throttle, else the first
    -- limit in request order, and within a limit rate before concurrency.
    v_refused := coalesce(v_until > v_now, false);
    v_retry := CASE WHEN v_refused THEN v_until END;
    v_reason := CASE WHEN v_refused THEN 'throttle' END;
    v_lim := CASE WHEN v_refused THEN v_caller END;
    v_grow := false;
    v_name := false;
    FOR i IN 1 .. n LOOP
      used[i] := CASE WHEN lcalls[i] IS NOT NULL THEN 0 END;
      held[i] := CASE WHEN lconc[i] IS NOT NULL THEN 0 END;
      grow[i] := false;
      IF lref[i] IS NOT NULL THEN
        -- Rule B (section 13): the level read after the bucket row (so a grant written only if
        -- the row is unchanged never misses a level written since); none reads initial.
        llv[i] := __SCHEMA__._lv_live(lk[i], v_now)::text;
        v_rate := __SCHEMA__._lv_retry(llv[i]::bigint[], lref[i], lbper[i], lburst[i], linit[i], ltok[i], v_now);
        IF v_rate IS NOT NULL AND (NOT v_refused OR v_rate > v_retry) THEN
          v_refused := true; v_retry := v_rate; v_reason := 'rate'; v_lim := lk[i];
        END IF;
        -- first named with a level below its burst: created at initial, granted or refused
        v_name := v_name OR (llv[i] IS NULL AND linit[i] < lburst[i]);
      END IF;
      CONTINUE WHEN bid[i] IS NULL;  -- a bucket that does not exist has room
      IF lcalls[i] IS NOT NULL AND (lcost[i] > 0 OR v_figures OR lad[i]) THEN
        -- The cost counting under this request's window (one probe, + the Fenwick tree if
        -- the bucket was ever settled) and, when it does not fit, the rate retryAt: when the
        -- first row whose running total reaches total + cost - calls leaves.
        SELECT w.used,
               CASE WHEN lcost[i] > 0 AND w.used + lcost[i] > lcalls[i] THEN
                 __SCHEMA__._rate_retry(bid[i], greatest(bw[i], v_now - br[i], v_now - lper[i]),
                   btot[i] + CASE WHEN bfen[i] THEN bdtot[i] ELSE 0 END + lcost[i] - lcalls[i],
                   lper[i], bfen[i], blast[i]) END
          INTO v_used, v_rate
          FROM (SELECT coalesce((SELECT btot[i] - (g.cum - g.cost)
                                        + CASE WHEN bfen[i] THEN bdtot[i] - __SCHEMA__._fen_sum(bid[i], g.seq - 1)
                                               ELSE 0 END
                                   FROM __SCHEMA__.grants g
                                  WHERE g.bucket = bid[i]
                                    AND g.at > greatest(bw[i], v_now - br[i], v_now - lper[i])
                                  ORDER BY g.at LIMIT 1), 0) AS used) w;
        used[i] := v_used;
        IF v_rate IS NOT NULL AND (NOT v_refused OR v_rate > v_retry) THEN
          v_refused := true; v_retry := v_rate; v_reason := 'rate'; v_lim := lk[i];
        END IF;
      END IF;
      IF lconc[i] IS NOT NULL THEN
        -- Full when the concurrent-th latest live lapse exists; room comes back when
        -- held - concurrent + 1 places have lapsed, that is at that very lapse.
        SELECT p.lapse INTO v_at FROM __SCHEMA__.places p
         WHERE p.bucket = bid[i] AND p.lapse > v_now
         ORDER BY p.lapse DESC OFFSET lconc[i] - 1 LIMIT 1;
        IF FOUND THEN
          v_at := least(v_at, v_now + recheck_ms);
          IF NOT v_refused OR v_at > v_retry THEN
            v_refused := true; v_retry := v_at; v_reason := 'concurrency'; v_lim := lk[i];
          END IF;
        END IF;
        IF v_figures THEN
          SELECT count(*) INTO v_at FROM __SCHEMA__.places p
           WHERE p.bucket = bid[i] AND p.lapse > v_now;
          held[i] := v_at;
        END IF;
      END IF;
      IF lper[i] > br[i] THEN
        -- rule 3: a longer window lengthens the retention of a live bucket
        grow[i] := NOT __SCHEMA__._idle(bid[i], v_now, br[i], bw[i], btot[i], bdtot[i], bfen[i]);
        v_grow := v_grow OR grow[i];
      END IF;
    END LOOP;

    IF v_figures THEN
      v_fig := '[]';
      FOR i IN 1 .. n LOOP
        v_fig := v_fig || jsonb_build_array(__SCHEMA__._figure(lk[i], lcalls[i], lconc[i],
          used[i] + CASE WHEN mode = 'report' AND NOT v_refused THEN lcost[i] ELSE 0 END,
          held[i] + CASE WHEN mode = 'report' AND NOT v_refused THEN 1 ELSE 0 END));
        IF lref[i] IS NOT NULL THEN
          -- a bucket's level in whole tokens (rounded down; negative in debt), after the grant
          -- for a report
          v_lv := CASE WHEN mode = 'report' AND NOT v_refused AND ltok[i] > 0
                       THEN __SCHEMA__._lv_take(llv[i]::bigint[], lref[i], lbper[i], lburst[i], linit[i], ltok[i], v_now)
                       ELSE llv[i]::bigint[] END;
          v_fig := jsonb_set(v_fig, ARRAY[(i - 1)::text], (v_fig->(i - 1)) || jsonb_build_object(
            'level', __SCHEMA__._floor_div(__SCHEMA__._lv_units(v_lv, lref[i], lbper[i], lburst[i], linit[i], v_now),
                                           lbper[i])::bigint,
            'burst', lburst[i]));
        END IF;
        IF lad[i] THEN
          -- the ceiling it is judged with (section 14)
          v_fig := jsonb_set(v_fig, ARRAY[(i - 1)::text], (v_fig->(i - 1))
                             || jsonb_build_object('ceiling', coalesce(lcalls[i], lref[i])));
        END IF;
      END LOOP;
    END IF;

    IF mode = 'peek' THEN
      IF v_refused THEN
        RETURN jsonb_build_object('fits', false, 'retryAt', v_retry, 'reason', v_reason,
                                  'limit', v_lim, 'now', v_now, 'limits', v_fig);
      END IF;
      RETURN jsonb_build_object('fits', true, 'now', v_now, 'limits', v_fig);
    END IF;

    IF v_refused THEN
      -- Nothing written, unless the refusal lengthens the retention of a live bucket or names
      -- a token bucket for the first time.
      IF v_grow OR v_name THEN
        PERFORM __SCHEMA__._lengthen(req, v_now, at_ms);
      END IF;
      v_reply := jsonb_build_object('granted', false, 'retryAt', v_retry, 'reason', v_reason,
                                    'limit', v_lim, 'now', v_now);
      IF v_figures THEN
        v_reply := v_reply || jsonb_build_object('limits', v_fig);
      END IF;
      RETURN v_reply;
    END IF;

    -- A grant. It writes, per bucket: the grant (window cost > 0, or any window when a
    -- permit is issued, so that settle finds the grant), a place, a growing retention.
    v_permit := CASE WHEN v_any_conc OR coalesce((req->>'permit')::boolean, false) THEN permit_id END;
    v_nneed := 0;
    v_keys := NULL;
    FOR i IN 1 .. n LOOP
      v_need[i] := lcost[i] > 0 OR lconc[i] IS NOT NULL OR grow[i]
                   OR (lcalls[i] IS NOT NULL AND v_permit IS NOT NULL)
                   OR (lref[i] IS NOT NULL AND (ltok[i] > 0 OR v_permit IS NOT NULL
                                                OR (llv[i] IS NULL AND linit[i] < lburst[i])));
      IF v_need[i] THEN
        v_nneed := v_nneed + 1;
        v_one := i;
        -- kept sorted (byte order): the order in which the rows are locked
        j := v_nneed;
        WHILE j > 1 AND v_keys[j - 1] COLLATE "C" > lk[i] COLLATE "C" LOOP
          v_keys[j] := v_keys[j - 1];
          j := j - 1;
        END LOOP;
        v_keys[j] := lk[i];
      END IF;
    END LOOP;
    EXIT WHEN v_locked OR v_nneed = 0;
    IF v_nneed = 1 AND bid[v_one] IS NOT NULL THEN
      EXIT;  -- write the one row optimistically below
    END IF;
    -- Lock every row the grant writes, in key order: ON CONFLICT DO UPDATE ... WHERE false
    -- creates a missing row or locks the existing one (updating nothing). Pass 2 reads them
    -- on snapshots taken after the locks.
    FOR j IN 1 .. v_nneed LOOP
      v_key := v_keys[j];
      INSERT INTO __SCHEMA__.buckets AS bk (key) VALUES (v_key)
      ON CONFLICT (key) DO UPDATE SET key = excluded.key WHERE false;
    END LOOP;
    v_locked := true;
    v_clock := greatest(v_now, coalesce(at_ms, __SCHEMA__._clock_ms()));
  END LOOP;

  -- The instant the grant is stamped with: the clock read after every row the decision read
  -- (and after any lock it waited for), so that it is no earlier than any release, settle or
  -- grant whose effect the decision saw. (The clock read first, as v_now was, may precede a
  -- release that a later statement's snapshot then sees: a grant reported before the release
  -- it needed.) A grant decided at v_now is a grant at any later instant: windows only lose
  -- grants as time passes, places only lapse, and what could add to them writes the bucket
  -- rows this grant writes only if unchanged (or holds locked). An injected instant (at_ms)
  -- stands as it is.
  IF at_ms IS NULL THEN
    v_now := greatest(v_now, __SCHEMA__._clock_ms());
  END IF;

  -- Write the grant, bucket by bucket.
  v_windows := '[]';
  FOR i IN 1 .. n LOOP
    CONTINUE WHEN NOT v_need[i];
    -- A ceiling forgotten with its idle bucket (section 14) stays forgotten once the bucket
    -- lives again, whether or not this request adapts: its row goes before the grant brings the
    -- bucket back (the one-statement acquires leave such a bucket to this path).
    DELETE FROM __SCHEMA__.ceilings ce
     WHERE ce.key = lk[i] AND (__SCHEMA__._kept_ceiling(lk[i], v_now)).key IS NULL;
    -- Retention (rule 3): an idle bucket starts afresh (checked only where that could change
    -- something); a longer window lengthens retention, and what the old one let go stays gone.
    v_r := br[i];
    v_w := bw[i];
    v_reset := false;
    IF (br[i] > coalesce(lper[i], 0)
        OR (bcalls[i] > 0 AND NOT (lcalls[i] IS NOT NULL AND lcost[i] > 0))
        OR (bconc[i] > 0 AND lconc[i] IS NULL))
       AND __SCHEMA__._idle(bid[i], v_now, br[i], bw[i], btot[i], bdtot[i], bfen[i]) THEN
      v_reset := true;
      IF br[i] > 0 THEN
        v_w := greatest(bw[i], v_now - br[i]);
      END IF;
      v_r := coalesce(lper[i], 0);
    ELSIF lper[i] > br[i] THEN
      IF br[i] > 0 THEN
        v_w := greatest(bw[i], v_now - br[i]);
      END IF;
      v_r := lper[i];
    END IF;
    v_seq := bseq[i];
    IF lcalls[i] IS NOT NULL AND (lcost[i] > 0 OR v_permit IS NOT NULL)
       AND blast[i] IS DISTINCT FROM v_now THEN
      v_seq := bseq[i] + 1;  -- a new row; else merged into this millisecond's row
    END IF;
    -- display figures: a granted window / place sets them, a fresh start forgets them
    v_calls := CASE WHEN lcalls[i] IS NOT NULL AND lcost[i] > 0 THEN lcalls[i]
                    WHEN v_reset THEN 0 ELSE bcalls[i] END;
    v_conc := CASE WHEN lconc[i] IS NOT NULL THEN lconc[i] WHEN v_reset THEN 0 ELSE bconc[i] END;
    IF v_nneed = 1 AND NOT v_locked THEN
      -- The one row, only if nobody changed it since the snapshot.
      UPDATE __SCHEMA__.buckets AS bk
         SET retain_ms = v_r, pruned_to = v_w, total = btot[i] + lcost[i], last_seq = v_seq,
             last_at = CASE WHEN v_seq <> bseq[i] THEN v_now ELSE blast[i] END,
             floor_ms = greatest(bk.floor_ms, v_now), last_calls = v_calls, last_concurrent = v_conc
       WHERE bk.key = lk[i] AND bk.xmin::text = bxm[i];
      GET DIAGNOSTICS v_rows = ROW_COUNT;
      IF v_rows = 0 THEN
        -- Changed (or forgotten) since: decide again, from the start, at an instant read
        -- again (never the one read before the wait: what the new decision sees may have
        -- been committed after it).
        RETURN __SCHEMA__._acquire_any(req, mode, recheck_ms, permit_id, at_ms);
      END IF;
    ELSE
      UPDATE __SCHEMA__.buckets AS bk
         SET retain_ms = v_r, pruned_to = v_w, total = btot[i] + lcost[i], last_seq = v_seq,
             last_at = CASE WHEN v_seq <> bseq[i] THEN v_now ELSE blast[i] END,
             floor_ms = greatest(bk.floor_ms, v_now), last_calls = v_calls, last_concurrent = v_conc
       WHERE bk.key = lk[i];
    END IF;
    IF lref[i] IS NOT NULL THEN
      -- Rule B: the grant takes min(cost, burst) from the level at its instant; a cost of 0
      -- names the bucket (at initial, when below its burst and no level lives).
      IF ltok[i] > 0 THEN
        PERFORM __SCHEMA__._lv_write(lk[i], __SCHEMA__._lv_take(llv[i]::bigint[], lref[i], lbper[i], lburst[i],
                                                                linit[i], ltok[i], v_now));
      ELSIF llv[i] IS NULL AND linit[i] < lburst[i] THEN
        PERFORM __SCHEMA__._lv_write(lk[i], __SCHEMA__._lv_of(linit[i]::numeric * lbper[i], lref[i], lbper[i],
                                                              lburst[i], v_now));
      ELSIF llv[i] IS NULL THEN
        -- a level forgotten and not yet swept stays forgotten: a place held now must not keep it
        DELETE FROM __SCHEMA__.levels lv WHERE lv.key = lk[i];
      END IF;
      IF v_permit IS NOT NULL THEN
        v_windows := v_windows || jsonb_build_array(jsonb_build_object(
          'k', lk[i], 'refill', lref[i], 'per', lbper[i], 'burst', lburst[i], 'cost', ltok[i]));
      END IF;
    END IF;
    IF lcalls[i] IS NOT NULL AND (lcost[i] > 0 OR v_permit IS NOT NULL) THEN
      IF v_seq <> bseq[i] THEN
        -- a new millisecond in the bucket (no row can exist at or after it): a plain insert
        INSERT INTO __SCHEMA__.grants (bucket, at, seq, cost, cum)
        VALUES (bid[i], v_now, v_seq, lcost[i], btot[i] + lcost[i]);
        IF bfen[i] THEN
          -- the new Fenwick node's share: deltas of rows (seq - lowbit(seq), seq - 1]
          SELECT coalesce(sum(f.d), 0) INTO v_d FROM __SCHEMA__.fen f
           WHERE f.bucket = bid[i] AND f.idx = ANY (__SCHEMA__._fen_down(v_seq - 1))
             AND f.idx > v_seq - (v_seq & -v_seq);
          IF v_d <> 0 THEN
            INSERT INTO __SCHEMA__.fen AS f (bucket, idx, d) VALUES (bid[i], v_seq, v_d)
            ON CONFLICT (bucket, idx) DO UPDATE SET d = excluded.d;
          END IF;
        END IF;
      ELSE
        INSERT INTO __SCHEMA__.grants AS g (bucket, at, seq, cost, cum)
        VALUES (bid[i], v_now, v_seq, lcost[i], btot[i] + lcost[i])
        ON CONFLICT (bucket, at) DO UPDATE SET cost = g.cost + excluded.cost, cum = excluded.cum;
      END IF;
      IF v_permit IS NOT NULL THEN
        v_windows := v_windows || jsonb_build_array(jsonb_build_object(
          'k', lk[i], 'b', bid[i], 'calls', lcalls[i], 'per', lper[i], 'cost', lcost[i]));
      END IF;
    END IF;
    IF lad[i] AND v_permit IS NOT NULL THEN
      -- What an outcome on the permit needs (section 14): whether the ceiling is in play just
      -- after the grant (the window holds at least half of C, this cost counted; a token
      -- bucket's level, after the take, is at most half its burst) and the cuts it saw.
      IF lref[i] IS NOT NULL THEN
        v_lv := CASE WHEN ltok[i] > 0
                     THEN __SCHEMA__._lv_take(llv[i]::bigint[], lref[i], lbper[i], lburst[i], linit[i], ltok[i], v_now)
                     ELSE llv[i]::bigint[] END;
        v_in_play := __SCHEMA__._lv_units(v_lv, lref[i], lbper[i], lburst[i], linit[i], v_now) * 2
                     <= lburst[i]::numeric * lbper[i];
      ELSE
        v_in_play := (used[i] + lcost[i]) * 2 >= lcalls[i];
      END IF;
      e := v_limits->(i - 1);
      v_adapted := v_adapted || jsonb_build_array(jsonb_build_object(
        'k', lk[i], 'min', (e->'adapt'->>'min')::bigint, 'max', (e->'adapt'->>'max')::bigint,
        'inc', (e->'adapt'->>'increase')::bigint, 'keep', (e->'adapt'->>'keepPct')::bigint,
        'start', coalesce((e->'adaptOwn'->>'calls')::bigint, (e->'adaptOwn'->>'refill')::bigint),
        'per', coalesce(lper[i], lbper[i]), 'inPlay', v_in_play,
        'cuts', coalesce((e->>'ceilingCuts')::bigint, 0), 'sig', false));
    END IF;
    IF lconc[i] IS NOT NULL AND v_permit IS NOT NULL THEN
      INSERT INTO __SCHEMA__.places (bucket, lapse, permit) VALUES (bid[i], v_now + lhold[i], v_permit);
      p_bid := p_bid || bid[i];
      p_lapse := p_lapse || (v_now + lhold[i]);
      v_lapse := greatest(v_lapse, v_now + lhold[i]);
    END IF;
  END LOOP;
  IF v_permit IS NOT NULL THEN
    IF coalesce((req->>'permit')::boolean, false) THEN
      v_lapse := greatest(v_lapse, v_now + coalesce((req->>'holdMs')::bigint, 600000));
    END IF;
    INSERT INTO __SCHEMA__.permits (id, at, lapse, place_buckets, place_lapses, windows, adapted)
    VALUES (v_permit, v_now, v_lapse, coalesce(p_bid, '{}'), coalesce(p_lapse, '{}'), v_windows,
            nullif(v_adapted, '[]'::jsonb));
  END IF;

  v_reply := jsonb_build_object('granted', true, 'at', v_now, 'permit', v_permit, 'now', v_now);
  IF v_figures THEN
    v_reply := v_reply || jsonb_build_object('limits', v_fig);
  END IF;
  RETURN v_reply;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._acquire_any(jsonb, text, bigint, text, bigint) IS
  'acquire, report or peek for any request (acquire decides the common case itself)';

-- acquire: the entry point (see _acquire_any for the contract). It decides itself the common
-- case, with few statements: mode 'acquire', one limit, no permit flag, a bucket that exists,
-- was never settled, and whose retention this request neither lengthens nor may restart.
-- Everything else goes to _acquire_any, which gives the same answers for every request; the
-- two are tested against each other and against the reference engine.
-- A refusal is one read-only statement (usually: see _rate_retry); a grant one more, which
-- writes only if the bucket row is unchanged since the read (see _acquire_any), else it reads
-- and decides again.
CREATE OR REPLACE FUNCTION __SCHEMA__._acquire_plain(req jsonb, mode text, recheck_ms bigint,
                                              permit_id text, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_l jsonb := req->'limits';
  v_k text;
  v_calls bigint;
  v_per bigint;
  v_conc bigint;
  v_cost bigint;
  v_hold bigint;
  v_rec boolean;
  b record;
  v_retry bigint;
  v_reason text;
  v_used bigint;
  v_at bigint;
  v_seq bigint;
  v_try integer;
  v_clock bigint;
BEGIN
  IF mode <> 'acquire' OR jsonb_array_length(v_l) <> 1 OR (req->>'permit')::boolean OR (v_l->0) ? 'refill'
     OR (v_l->0) ? 'adapt' THEN
    -- (a token bucket, section 13, and an adapted limit, section 14, are decided by the general
    -- path)
    RETURN __SCHEMA__._acquire_any(req, mode, recheck_ms, permit_id, at_ms);
  END IF;
  v_l := v_l->0;
  v_k := v_l->>'key';
  v_calls := (v_l->>'calls')::bigint;
  v_per := (v_l->>'perMs')::bigint;
  v_conc := (v_l->>'concurrent')::bigint;
  v_cost := CASE WHEN v_calls IS NOT NULL
                 THEN least(coalesce((v_l->>'cost')::bigint, (req->>'cost')::bigint, 1), v_calls) END;
  -- a grant records a window row when it costs, or when it holds a place (its permit can
  -- then settle it)
  v_rec := coalesce(v_cost > 0, false) OR (v_calls IS NOT NULL AND v_conc IS NOT NULL);
  FOR v_try IN 1 .. 3 LOOP
    -- The instant, then in one statement (one snapshot) the row, now (the clock floored by the
    -- bucket), the caller's throttle, whether a ceiling row exists (section 14) and the first
    -- grant row of this request's window: four index probes, and no second statement to start.
    v_clock := coalesce(at_ms, __SCHEMA__._clock_ms());
    SELECT bk.id, bk.retain_ms, bk.pruned_to, bk.total, bk.fen, bk.last_seq, bk.last_at,
           bk.last_calls, bk.last_concurrent, bk.queued, bk.xmin::text AS xm,
           greatest(v_clock, bk.floor_ms) AS now,
           (SELECT th.until FROM __SCHEMA__.throttles th WHERE th.key = req->>'key') AS until,
           EXISTS (SELECT 1 FROM __SCHEMA__.ceilings ce WHERE ce.key = bk.key) AS ceiled,
           w.at AS first_at, w.cum AS first_cum, w.cost AS first_cost
      INTO b
      FROM __SCHEMA__.buckets bk
      LEFT JOIN LATERAL (
        SELECT g.at, g.cum, g.cost FROM __SCHEMA__.grants g
         WHERE v_cost > 0 AND g.bucket = bk.id
           AND g.at > greatest(bk.pruned_to, greatest(v_clock, bk.floor_ms) - bk.retain_ms,
                               greatest(v_clock, bk.floor_ms) - v_per)
         ORDER BY g.at LIMIT 1) w ON true
     WHERE bk.key = v_k;
    IF FOUND AND b.queued > 0 AND NOT req ? 'lineDecided' THEN
      -- a bucket with a line: rule Q decides (see _acquire_any)
      RETURN __SCHEMA__._acquire_line(req, mode, recheck_ms, permit_id, at_ms);
    END IF;
    IF NOT FOUND OR b.fen OR v_per > b.retain_ms THEN
      -- a new bucket, a settled one, or a window longer than the retention (rule 3)
      RETURN __SCHEMA__._acquire_any(req, mode, recheck_ms, permit_id, at_ms);
    END IF;
    -- The refusal that stands: the latest retryAt; on a tie the throttle, then rate, then
    -- concurrency.
    v_retry := NULL;
    IF b.until > b.now THEN
      v_retry := b.until;
      v_reason := 'throttle';
    END IF;
    IF v_cost > 0 THEN
      -- the cost counting under this request's window (NULL: no row in it)
      v_used := b.total - (b.first_cum - b.first_cost);
      IF v_used + v_cost > v_calls THEN
        -- when enough of the oldest grants have left for this cost to fit: when the first
        -- row whose running total reaches total + cost - calls leaves the window; usually
        -- the first row of the window, already read
        v_at := CASE WHEN b.first_cum >= b.total + v_cost - v_calls THEN b.first_at + v_per
                     ELSE __SCHEMA__._rate_retry(b.id, b.first_at, b.total + v_cost - v_calls, v_per,
                                                 false, b.last_at) END;
        IF v_at > coalesce(v_retry, v_at - 1) THEN
          v_retry := v_at;
          v_reason := 'rate';
        END IF;
      END IF;
    END IF;
    IF v_conc IS NOT NULL THEN
      -- full when the concurrent-th latest live lapse exists; room comes back at that lapse
      SELECT p.lapse INTO v_at FROM __SCHEMA__.places p
       WHERE p.bucket = b.id AND p.lapse > b.now
       ORDER BY p.lapse DESC OFFSET v_conc - 1 LIMIT 1;
      IF FOUND AND least(v_at, b.now + recheck_ms) > coalesce(v_retry, b.now) THEN
        v_retry := least(v_at, b.now + recheck_ms);
        v_reason := 'concurrency';
      END IF;
    END IF;
    IF v_retry IS NOT NULL THEN
      RETURN jsonb_build_object('granted', false, 'retryAt', v_retry, 'reason', v_reason,
                                'limit', CASE WHEN v_reason = 'throttle' THEN req->>'key' ELSE v_k END,
                                'now', b.now);
    END IF;

    -- A grant, stamped with the clock read after the rows it was decided on (see
    -- _acquire_any: no earlier than a release or settle the decision saw).
    IF at_ms IS NULL THEN
      b.now := greatest(b.now, __SCHEMA__._clock_ms());
    END IF;
    -- A bucket that may be idle with a longer retention, or figures this grant
    -- does not set, may start afresh (rule 3): the general path decides that; and one whose
    -- ceiling went with it (section 14), which the general path forgets before the grant.
    IF b.retain_ms > coalesce(v_per, 0)
       OR (b.last_calls > 0 AND NOT coalesce(v_cost, 0) > 0)
       OR (b.last_concurrent > 0 AND v_conc IS NULL)
       OR (b.ceiled AND (__SCHEMA__._kept_ceiling(v_k, b.now)).key IS NULL) THEN
      RETURN __SCHEMA__._acquire_any(req, mode, recheck_ms, permit_id, at_ms);
    END IF;
    v_seq := CASE WHEN v_rec AND b.last_at IS DISTINCT FROM b.now THEN b.last_seq + 1
                  ELSE b.last_seq END;
    -- Written only if nobody changed the row since it was read: the UPDATE locks the row and
    -- re-checks its condition on the row's latest version. The grant row goes in the same
    -- statement, only if the UPDATE did.
    IF v_seq <> b.last_seq THEN
      -- a new millisecond in the bucket (no row can exist at or after it): a plain insert
      WITH u AS (
        UPDATE __SCHEMA__.buckets AS bk
           SET total = b.total + v_cost, last_seq = v_seq, last_at = b.now,
               floor_ms = greatest(bk.floor_ms, b.now),
               last_calls = CASE WHEN v_cost > 0 THEN v_calls ELSE bk.last_calls END,
               last_concurrent = coalesce(v_conc, bk.last_concurrent)
         WHERE bk.key = v_k AND bk.xmin::text = b.xm
        RETURNING bk.id
      )
      INSERT INTO __SCHEMA__.grants (bucket, at, seq, cost, cum)
      SELECT u.id, b.now, v_seq, v_cost, b.total + v_cost FROM u;
    ELSE
      WITH u AS (
        UPDATE __SCHEMA__.buckets AS bk
           SET total = b.total + coalesce(v_cost, 0),
               floor_ms = greatest(bk.floor_ms, b.now),
               last_calls = CASE WHEN v_cost > 0 THEN v_calls ELSE bk.last_calls END,
               last_concurrent = coalesce(v_conc, bk.last_concurrent)
         WHERE bk.key = v_k AND bk.xmin::text = b.xm
        RETURNING bk.id
      )
      -- merged into this millisecond's row (or none recorded)
      INSERT INTO __SCHEMA__.grants AS g (bucket, at, seq, cost, cum)
      SELECT u.id, b.now, v_seq, v_cost, b.total + v_cost FROM u WHERE v_rec
      ON CONFLICT (bucket, at) DO UPDATE SET cost = g.cost + excluded.cost, cum = excluded.cum;
      IF NOT v_rec THEN
        -- nothing recorded: did the UPDATE happen? (then the row carries this transaction)
        PERFORM 1 FROM __SCHEMA__.buckets bk
         WHERE bk.key = v_k AND bk.xmin = pg_current_xact_id_if_assigned()::xid;
      END IF;
    END IF;
    IF FOUND THEN
      IF v_conc IS NULL THEN
        RETURN jsonb_build_object('granted', true, 'at', b.now, 'permit', NULL, 'now', b.now);
      END IF;
      v_hold := coalesce((v_l->>'holdMs')::bigint, (req->>'holdMs')::bigint, 600000);
      INSERT INTO __SCHEMA__.places (bucket, lapse, permit) VALUES (b.id, b.now + v_hold, permit_id);
      INSERT INTO __SCHEMA__.permits (id, at, lapse, place_buckets, place_lapses, windows)
      VALUES (permit_id, b.now, b.now + v_hold, ARRAY[b.id], ARRAY[b.now + v_hold],
              CASE WHEN v_calls IS NULL THEN '[]'::jsonb
                   ELSE jsonb_build_array(jsonb_build_object('k', v_k, 'b', b.id, 'calls', v_calls,
                                                             'per', v_per, 'cost', v_cost)) END);
      RETURN jsonb_build_object('granted', true, 'at', b.now, 'permit', permit_id, 'now', b.now);
    END IF;
    -- Changed since the read (the UPDATE then usually holds the row's lock): read again, at
    -- an instant read again (the bucket's floor keeps it from running backwards).
  END LOOP;
  RETURN __SCHEMA__._acquire_any(req, mode, recheck_ms, permit_id, at_ms);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._acquire_plain(jsonb, text, bigint, text, bigint) IS
  'acquire, report or peek (wire sections 3 and 9.1-9.2) of a request no line holds back';

---------------------------------------------------------------------------------------------
-- The line (wire section 12, bounded by 12.9). acquire() is the entry of every acquire, report
-- and peek: a request that neither queues nor presents a ticket goes to _acquire_plain(), which
-- reads each bucket's line count (buckets.queued) with the bucket row and hands the request to
-- _acquire_line() when one of its buckets has a line; every other request goes to
-- _acquire_line(), which applies rule Q (12.2, as 12.9 bounds it) and files, renews and ends
-- tickets. req may carry "queue": true, "ticket": "t-…" (a string of ours: the server passes no
-- other), "graceMs" (default 2000), "maxWaitMs" and "lineHorizonMs" (the server's horizon,
-- default 300000). _acquire_line() hands a request it lets through back with "lineDecided":
-- true, which _acquire_plain() and _acquire_any() then decide without looking at the line.
--
-- Order (12.9, once): a bucket's line changes only under its bucket row's lock: filing a ticket
-- locks the rows of every bucket it names (in key order, creating missing ones), counts it in
-- buckets.queued and raises their floor_ms to its filing instant; ending one locks them too and
-- counts it out. A grant writes the same rows. So filings and grants of one bucket are decided
-- one after another, each at an instant no earlier than the one before it (the floor), and a
-- ticket's number, filing instant and place in every line it joins agree. A one-statement or
-- plain grant decided on a row read before a filing finds the row changed (its xmin) and
-- decides again, seeing the line. A ticket is locked (FOR UPDATE) before its buckets, and only
-- by the one request that ends it or by leave() and sweep_tickets(), so a ticket presented
-- from many sessions at once is granted once: the others find it ended.

-- The limits a ticket binds (12.3): the request's, defaults resolved, sorted by key.
CREATE OR REPLACE FUNCTION __SCHEMA__._bound(req jsonb) RETURNS jsonb
LANGUAGE sql IMMUTABLE AS
$$
  SELECT coalesce(jsonb_agg(CASE WHEN x ? 'adaptOwn'
                                  THEN x - 'adaptOwn' - 'ceilingCuts' || (x->'adaptOwn')
                                  ELSE x END ORDER BY (x->>'key') COLLATE "C"), '[]'::jsonb)
    FROM jsonb_array_elements(req->'limits') AS x
$$;

-- The live tickets in bucket p_key's line at p_now: its count less the lapsed rows not yet
-- swept (a few: the sweeper ends lapsed tickets every second).
CREATE OR REPLACE FUNCTION __SCHEMA__._queued(p_key text, p_now bigint) RETURNS bigint
LANGUAGE sql STABLE AS
$$
  SELECT coalesce((SELECT bk.queued FROM __SCHEMA__.buckets bk WHERE bk.key = p_key), 0)
         - (SELECT count(*) FROM __SCHEMA__.line q WHERE q.bucket = p_key AND q.lapse_at <= p_now)
$$;

-- Whether a line of the buckets p_keys holds 10,000 live tickets at p_now (12.1): its count
-- first, then (only at the bound) its lapsed rows not yet swept.
CREATE OR REPLACE FUNCTION __SCHEMA__._line_full(p_keys text[], p_now bigint) RETURNS boolean
LANGUAGE sql STABLE AS
$$
  SELECT EXISTS (SELECT 1 FROM __SCHEMA__.buckets bk
                  WHERE bk.key = ANY (p_keys) AND bk.queued >= 10000
                    AND __SCHEMA__._queued(bk.key, p_now) >= 10000)
$$;

-- The most live tickets ahead of ticket p_num in any one of its lines.
CREATE OR REPLACE FUNCTION __SCHEMA__._ahead(p_num bigint, p_now bigint) RETURNS bigint
LANGUAGE sql STABLE AS
$$
  SELECT coalesce(max(c.n), 0) FROM (
    SELECT (SELECT count(*) FROM __SCHEMA__.line q
             WHERE q.bucket = k.key AND q.num < p_num AND q.lapse_at + 0 > p_now) AS n
      FROM __SCHEMA__.tickets me CROSS JOIN LATERAL unnest(me.keys) AS k(key)
     WHERE me.num = p_num) c
$$;

-- Wake-ups (wire section 15): every change that can make a waited ticket ready sends, inside
-- its transaction, one notification per key it freed on the channel named after this schema
-- (so it is delivered when the change commits, and only if it does): a bucket key whose line
-- holds tickets (a place released, a ticket ahead ended or gone, a settle down), or a caller
-- key (a throttle lifted). Every server LISTENs on that channel and wakes its waits on the key.
-- A key is at most 1,024 bytes escaped, well under a notification's 8,000; identical
-- notifications of one transaction are delivered once. A change to a bucket with no line
-- notifies nobody: no wait can name it, and a notifying commit takes PostgreSQL's notify
-- queue lock.
CREATE OR REPLACE FUNCTION __SCHEMA__._wake(p_keys text[]) RETURNS void
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_key text;
BEGIN
  FOR v_key IN SELECT DISTINCT k FROM unnest(p_keys) AS k LOOP
    PERFORM pg_notify(btrim('__SCHEMA__', '"'), v_key);
  END LOOP;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._wake(text[]) IS
  'notify the servers'' waits (section 15) that room may have come back in these keys, at commit';

-- Ends ticket p_num (granted, left or lapsed): it leaves every line, counted out of each under
-- its bucket row's lock (taken in key order), and the lines that still hold tickets are woken
-- (_wake). Granted (p_granted), it wakes only the lines where a ticket wants a place: a ticket
-- behind it that wants a place waited for it to end (rule Q lets no place be taken past a
-- ticket ahead), while one that wants only window room was told its instant with this grant
-- counted at its own, which the grant does not bring closer. The caller holds the ticket's row
-- lock. It is _end_ticket_as, not an overload of _end_ticket(bigint): a server of an earlier
-- release sharing the schema recreates _end_ticket(bigint), and an overload with a default would
-- make every one-argument call ambiguous. (An earlier build of this script made that overload:
-- dropped here.)
DROP FUNCTION IF EXISTS __SCHEMA__._end_ticket(bigint, boolean);
CREATE OR REPLACE FUNCTION __SCHEMA__._end_ticket_as(p_num bigint, p_granted boolean) RETURNS void
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_keys text[];
  v_key text;
  v_left bigint;
  v_wake text[] := '{}';
BEGIN
  SELECT t.keys INTO v_keys FROM __SCHEMA__.tickets t WHERE t.num = p_num;
  IF NOT FOUND THEN
    RETURN;
  END IF;
  FOR v_key IN SELECT k FROM unnest(v_keys) AS k ORDER BY k COLLATE "C" LOOP
    UPDATE __SCHEMA__.buckets SET queued = queued - 1 WHERE key = v_key RETURNING queued INTO v_left;
    IF v_left > 0 AND (NOT p_granted OR EXISTS (SELECT 1 FROM __SCHEMA__.line q
                                                 WHERE q.bucket = v_key AND q.num <> p_num AND q.conc > 0)) THEN
      v_wake := v_wake || v_key;
    END IF;
  END LOOP;
  DELETE FROM __SCHEMA__.line q WHERE q.bucket = ANY (v_keys) AND q.num = p_num;
  DELETE FROM __SCHEMA__.tickets WHERE num = p_num;
  IF cardinality(v_wake) > 0 THEN
    PERFORM __SCHEMA__._wake(v_wake);  -- the tickets behind it may be ready now
  END IF;
END
$$;

-- Ends ticket p_num as left or lapsed (see _end_ticket_as).
CREATE OR REPLACE FUNCTION __SCHEMA__._end_ticket(p_num bigint) RETURNS void
LANGUAGE plpgsql VOLATILE AS
$$
BEGIN
  PERFORM __SCHEMA__._end_ticket_as(p_num, false);
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.acquire(req jsonb, mode text, recheck_ms bigint,
                                              permit_id text, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
BEGIN
  -- (section 14; the request itself when nothing adapts)
  req := __SCHEMA__._judged(req, coalesce(at_ms, __SCHEMA__._clock_ms()));
  IF req ? 'queue' OR req ? 'ticket' THEN
    RETURN __SCHEMA__._acquire_line(req, mode, recheck_ms, permit_id, at_ms);
  END IF;
  RETURN __SCHEMA__._acquire_plain(req, mode, recheck_ms, permit_id, at_ms);
END
$$;
COMMENT ON FUNCTION __SCHEMA__.acquire(jsonb, text, bigint, text, bigint) IS
  'acquire, report or peek (wire sections 3, 9.1-9.2 and 12); refusals and peeks write nothing but a ticket';

-- Rule Q in bucket p_key as section 12.9 bounds it, for a limit (p_calls, p_per, p_cost capped
-- at calls, p_conc; NULL where the limit has none) of a request presenting live ticket p_mine
-- (NULL: none, every ticket is older) at p_now: NULL when the line lets it through, else the
-- instant it is told for this line. The engine's Engine::line_refusal, step for step:
--   The tickets older than p_mine that hold (live, their caller not throttled: a throttled
--   ticket yields; one that takes only a window here, no place and no token bucket, holds from
--   a window before the retryAt it was last told on) are walked in number order. Each with a
--   window here and a cost is reserved the earliest instant, no sooner than the one reserved
--   before it (or now), at which its own window (calls per perMs) has room for its cost,
--   counting the bucket's kept grants (those counting at now) and the reservations ahead of it
--   at their instants. The request backfills (the line lets it through) when its limit has no
--   concurrent and its cost, counted at now, leaves every reserved ticket room at its reserved
--   instant (where the ticket's window still counts a grant made now). Otherwise it is told the
--   latest of now + 1, its own reserved instant behind them all (a window with a cost), and for
--   a place the instant the places the tickets ahead want come back (or as the first ticket
--   that holds is told: its retryAt; a millisecond on while it is due; a recheck on once it is
--   late), at most a recheck on.
-- One pass over the tickets ahead (one index read in order) and over the bucket's grants.
-- A token bucket (section 13; p_refill, p_per, p_burst, p_initial, NULL where the limit has
-- none) is asked the same of its level: each ticket naming it as one is reserved the earliest
-- instant, no sooner than the one before, at which the level (refilling with the ticket's own
-- figures, the costs reserved before it taken at their instants) reaches its min(cost, burst);
-- the request backfills where the level left at each reservation still covers its own cost,
-- and is otherwise told its own earliest instant behind them.
DROP FUNCTION IF EXISTS __SCHEMA__._line_refusal(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint);
CREATE OR REPLACE FUNCTION __SCHEMA__._line_refusal(p_key text, p_now bigint, p_mine bigint,
                                                    p_calls bigint, p_per bigint, p_cost bigint,
                                                    p_conc bigint, p_recheck bigint, p_refill bigint,
                                                    p_burst bigint, p_initial bigint)
RETURNS bigint
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  b record;
  q record;
  v_cost bigint := CASE WHEN p_calls IS NULL THEN 0 ELSE least(coalesce(p_cost, 0), p_calls) END;
  v_tok bigint := CASE WHEN p_refill IS NULL THEN 0 ELSE least(coalesce(p_cost, 0), p_burst) END;
  -- the token reservations: the level after the last one (NULL: none, read at each initial)
  -- and its instant (at first, now); read once the first time it is needed
  v_lv bigint[];
  v_lv_at bigint;
  v_lv_read boolean := false;
  v_units numeric;
  v_needed numeric;
  v_until bigint;
  v_backfills boolean := p_conc IS NULL;
  v_wanting bigint := 0;
  v_first bigint;
  -- the bucket's kept grants (instant, cost as settled), oldest first; gs: running sums
  ga bigint[]; gc bigint[]; gs bigint[]; ng integer := -1;  -- -1: not read yet
  -- the reservations in order; rs: running sums
  ra bigint[] := '{}'; rc bigint[] := '{}'; rs bigint[] := '{0}'; nr integer := 0;
  v_from bigint; v_cut bigint; v_t bigint; v_used bigint; v_leave bigint;
  -- gi, ri: the first grant and reservation still counting at v_from. Both move forward as
  -- the reservations do (back only where tickets' windows differ in length).
  gi integer := 1; ri integer := 1;
  i integer; j integer;
  v_at bigint;
  v_held bigint; v_need bigint; v_retry bigint; v_x bigint; v_recheck bigint;
  v_ceiling bigint;  -- the bucket's ceiling (section 14), for the tickets that adapt here
BEGIN
  SELECT bk.id, bk.retain_ms, bk.pruned_to, bk.fen, bk.queued INTO b
    FROM __SCHEMA__.buckets bk WHERE bk.key = p_key;
  IF NOT FOUND OR b.queued <= 0 THEN
    RETURN NULL;
  END IF;
  IF v_backfills AND v_cost = 0 AND v_tok = 0 THEN
    RETURN NULL;  -- no place and no cost: it delays no one
  END IF;
  SELECT ce.c INTO v_ceiling FROM __SCHEMA__._kept_ceiling(p_key, p_now) ce;
  -- The tickets that hold, in order, then (me) the request itself: its own reserved instant
  -- behind them is found by the same steps.
  FOR q IN
    SELECT * FROM (
      SELECT * FROM (
        SELECT false AS me, l.num,
               CASE WHEN a.c IS NULL OR l.calls = 0 THEN l.calls ELSE a.c END AS calls, l.per_ms,
               CASE WHEN a.c IS NULL THEN l.cost WHEN l.calls > 0 THEN least(l.asked_cost, a.c)
                    ELSE least(l.asked_cost, a.burst) END AS cost,
               l.conc,
               CASE WHEN a.c IS NULL OR l.refill = 0 THEN l.refill ELSE a.c END AS refill,
               CASE WHEN a.c IS NULL OR l.refill = 0 THEN l.burst ELSE a.burst END AS burst,
               CASE WHEN a.c IS NULL OR l.refill = 0 THEN l.initial ELSE least(l.initial, a.burst) END AS initial
          FROM __SCHEMA__.line l
          -- a ticket that adapts here: its own figures judged with the bucket's ceiling (14)
          LEFT JOIN LATERAL (
               SELECT j.c, CASE WHEN l.refill > 0 THEN greatest(1, div(l.burst::numeric * j.c, l.refill))::bigint
                           END AS burst
                 FROM (SELECT least(greatest(coalesce(v_ceiling,
                                                      CASE WHEN l.calls > 0 THEN l.calls ELSE l.refill END),
                                             l.adapt_min), l.adapt_max) AS c) j
                WHERE l.adapt_min IS NOT NULL) a ON true
         WHERE l.bucket = p_key AND l.num < coalesce(p_mine, 9223372036854775807)
           AND l.lapse_at + 0 > p_now  -- (read in number order: on the primary key, not line_lapse)
           AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.throttles th WHERE th.key = l.caller AND th.until > p_now)
           -- one that takes only a window here holds from a window before its retryAt on
           -- (Waiting::reserves; the ticket is read only for such a one)
           AND NOT (l.calls > 0 AND l.conc = 0 AND l.refill = 0
                    AND p_now + l.per_ms <= coalesce((SELECT t.retry_at FROM __SCHEMA__.tickets t
                                                      WHERE t.num = l.num), 0))
         ORDER BY l.num) h
      UNION ALL
      SELECT true, NULL, coalesce(p_calls, 0), coalesce(p_per, 0), v_cost, coalesce(p_conc, 0), 0, 0, 0) x
  LOOP
    IF q.me THEN
      EXIT WHEN v_first IS NULL OR v_backfills OR v_cost = 0;
    ELSE
      v_first := coalesce(v_first, q.num);
      IF q.conc > 0 THEN
        v_wanting := v_wanting + 1;
      END IF;
      IF q.refill > 0 AND q.cost > 0 AND (v_backfills OR v_tok > 0) THEN
        -- Reserved in the level (Reservations::reserve): its earliest instant, and what it leaves.
        IF NOT v_lv_read THEN
          v_lv := __SCHEMA__._lv_live(p_key, p_now);
          v_lv_at := p_now;
          v_lv_read := true;
        END IF;
        v_units := __SCHEMA__._lv_units(v_lv, q.refill, q.per_ms, q.burst, q.initial, v_lv_at);
        v_needed := least(q.cost, q.burst)::numeric * q.per_ms;
        IF v_units < v_needed THEN
          v_until := __SCHEMA__._to_bigint(v_lv_at + __SCHEMA__._ceil_div(v_needed - v_units, q.refill));
          v_units := __SCHEMA__._lv_units(__SCHEMA__._lv_of(v_units, q.refill, q.per_ms, q.burst, v_lv_at),
                                          q.refill, q.per_ms, q.burst, q.initial, v_until);
          v_lv_at := v_until;
        END IF;
        v_lv := __SCHEMA__._lv_of(v_units - v_needed, q.refill, q.per_ms, q.burst, v_lv_at);
        -- This request's take now lowers the level there by at most its cost.
        IF v_backfills AND v_tok > 0 AND __SCHEMA__._floor_div(v_units - v_needed, q.per_ms) < v_tok THEN
          v_backfills := false;
        END IF;
      END IF;
      CONTINUE WHEN q.calls = 0 OR q.cost = 0;
      -- reservations matter only to a backfill, or to a reserved instant of its own
      CONTINUE WHEN NOT v_backfills AND v_cost = 0;
    END IF;
    IF ng < 0 THEN
      SELECT coalesce(array_agg(g.at ORDER BY g.at), '{}'),
             coalesce(array_agg(g.cost + CASE WHEN b.fen
                                 THEN __SCHEMA__._fen_sum(b.id, g.seq) - __SCHEMA__._fen_sum(b.id, g.seq - 1)
                                 ELSE 0 END ORDER BY g.at), '{}')
        INTO ga, gc
        FROM __SCHEMA__.grants g
       WHERE g.bucket = b.id AND g.at > greatest(b.pruned_to, p_now - b.retain_ms);
      ng := coalesce(array_length(ga, 1), 0);
      gs := '{0}';
      FOR i IN 1 .. ng LOOP
        gs[i + 1] := gs[i] + gc[i];
      END LOOP;
    END IF;
    -- The earliest instant from the last reservation (or now) at which q.calls per q.per_ms
    -- has room for q.cost: the grants counting at now (under min(perMs, retention)) and still
    -- at v_from, and the reservations still counting at v_from, leave in time order until it
    -- fits; then every other that leaves at that instant goes too.
    v_from := CASE WHEN nr > 0 THEN ra[nr] ELSE p_now END;
    v_cut := greatest(p_now - least(q.per_ms, b.retain_ms), v_from - q.per_ms);
    WHILE gi <= ng AND ga[gi] <= v_cut LOOP gi := gi + 1; END LOOP;
    WHILE gi > 1 AND ga[gi - 1] > v_cut LOOP gi := gi - 1; END LOOP;
    WHILE ri <= nr AND ra[ri] + q.per_ms <= v_from LOOP ri := ri + 1; END LOOP;
    WHILE ri > 1 AND ra[ri - 1] + q.per_ms > v_from LOOP ri := ri - 1; END LOOP;
    i := gi; j := ri;
    v_used := (gs[ng + 1] - gs[i]) + (rs[nr + 1] - rs[j]);
    v_t := v_from;
    LOOP
      IF i <= ng AND (j > nr OR ga[i] <= ra[j]) THEN
        v_leave := ga[i] + q.per_ms;
        EXIT WHEN v_used + q.cost <= q.calls AND v_leave > v_t;
        v_used := v_used - gc[i];
        i := i + 1;
      ELSIF j <= nr THEN
        v_leave := ra[j] + q.per_ms;
        EXIT WHEN v_used + q.cost <= q.calls AND v_leave > v_t;
        v_used := v_used - rc[j];
        j := j + 1;
      ELSE
        EXIT;
      END IF;
      v_t := greatest(v_t, v_leave);
    END LOOP;
    IF q.me THEN
      v_at := v_t;
      EXIT;
    END IF;
    nr := nr + 1;
    ra[nr] := v_t; rc[nr] := q.cost; rs[nr + 1] := rs[nr] + q.cost;
    -- This request's cost, granted now, still counts there at v_t: it must leave room.
    IF v_backfills AND v_cost > 0 AND p_now + q.per_ms > v_t AND v_used + q.cost + v_cost > q.calls THEN
      v_backfills := false;
    END IF;
  END LOOP;
  IF v_first IS NULL OR v_backfills THEN
    RETURN NULL;
  END IF;
  v_at := greatest(p_now + 1, coalesce(v_at, p_now + 1));
  IF v_tok > 0 THEN
    -- its own earliest instant in the level, behind the reservations
    IF NOT v_lv_read THEN
      v_lv := __SCHEMA__._lv_live(p_key, p_now);
      v_lv_at := p_now;
    END IF;
    v_at := greatest(v_at, v_lv_at, coalesce(__SCHEMA__._lv_retry(v_lv, p_refill, p_per, p_burst, p_initial, v_tok,
                                                                   v_lv_at), v_lv_at));
  END IF;
  IF p_conc IS NOT NULL THEN
    -- Once enough held places have lapsed for every ticket ahead that wants one and for it,
    -- or else as the first ticket that holds is told; at most a recheck on.
    v_recheck := p_now + p_recheck;
    SELECT count(*) INTO v_held FROM __SCHEMA__.places p WHERE p.bucket = b.id AND p.lapse > p_now;
    v_need := v_held + v_wanting + 1;
    IF v_need > p_conc AND v_need - p_conc <= v_held THEN
      SELECT p.lapse INTO v_x FROM __SCHEMA__.places p
       WHERE p.bucket = b.id AND p.lapse > p_now
       ORDER BY p.lapse OFFSET v_need - p_conc - 1 LIMIT 1;
    ELSE
      SELECT t.retry_at INTO v_retry FROM __SCHEMA__.tickets t WHERE t.num = v_first;
      v_x := CASE WHEN v_retry > p_now THEN v_retry
                  WHEN p_now - v_retry <= 50 THEN p_now + 1
                  ELSE v_recheck END;
    END IF;
    v_at := greatest(v_at, least(v_x, v_recheck));
  END IF;
  RETURN v_at;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._line_refusal(text, bigint, bigint, bigint, bigint, bigint, bigint, bigint, bigint,
                                             bigint, bigint) IS
  'rule Q in one bucket as section 12.9 bounds it: NULL when the line lets the limit through, else its instant';

-- Rule Q and the tickets. The ticket presented is read first (a live one bound to another
-- request raises RL400 naming ticket, and nothing changes; a lapsed one counts as unknown, its
-- lapse counted once). Then, per limit in request order, the line's refusal (_line_refusal) and
-- the request's own (a peek of _acquire_plain at the same instant, which writes nothing) are
-- merged as rule 6 merges refusals (the latest; on a tie the throttle, else the first limit,
-- and within one limit the window, then the line, then concurrency). Pass 1 decides on
-- snapshots with no lock: a peek, a refusal that files nothing and a renewal answer from
-- there. A grant, and a refusal that files a ticket, lock the ticket (FOR UPDATE) and then
-- every bucket row (in key order, creating missing ones) and decide again (pass 2) at an
-- instant read after the locks. A grant ends the request's ticket; a refusal renews it (its
-- lapse: retryAt + grace, never after its deadline nor before now + 1), or files one (queue,
-- or an unknown ticket) when refused for rate or concurrency, unless the request's own instant
-- lies beyond its horizon (min(maxWaitMs, the server's); "noTicket": "horizon") or a line it
-- names holds 10,000 live tickets ("noTicket": "full"). The reply adds "ticket", "lapseAt",
-- "ahead" and "now" when it names a ticket, and "queued" to each figure when the request takes
-- part in the line or that line is not empty; for the server's metrics, "waitedMs" (filing to
-- grant) when a grant ended a ticket, and "lapsedTicket" when the ticket presented had lapsed.
CREATE OR REPLACE FUNCTION __SCHEMA__._acquire_line(req jsonb, mode text, recheck_ms bigint,
                                                    permit_id text, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_inline boolean := coalesce((req->>'queue')::boolean, false) OR req ? 'ticket';
  v_grace bigint := coalesce((req->>'graceMs')::bigint, 2000);
  v_server bigint := coalesce((req->>'lineHorizonMs')::bigint, 300000);
  v_horizon bigint;
  v_peek boolean := mode = 'peek';
  v_decided jsonb := req || '{"lineDecided": true}'::jsonb;
  v_limits jsonb := req->'limits';
  n integer;
  i integer;
  e jsonb;
  lk text[]; lcalls bigint[]; lper bigint[]; lcost bigint[]; lconc bigint[];
  lref bigint[]; lburst bigint[]; linit bigint[];
  v_key text;
  v_now bigint;
  t record;
  v_have boolean := false;
  v_mine bigint;
  v_locked boolean := false;
  v_lapsed boolean := false;
  v_at bigint;
  v_lat bigint;
  v_lidx integer;
  v_own jsonb;
  v_own_at bigint;
  v_oidx integer;
  v_refused boolean;
  v_retry bigint;
  v_reason text;
  v_limit text;
  v_reply jsonb;
  v_num bigint;
  v_lapse bigint;
  v_no text;
  v_rows integer;
  v_figs jsonb;
  v_ticket text;
BEGIN
  v_horizon := least(v_server, coalesce((req->>'maxWaitMs')::bigint, v_server));
  n := coalesce(jsonb_array_length(v_limits), 0);
  FOR i IN 1 .. n LOOP
    e := v_limits->(i - 1);
    lk[i] := e->>'key';
    lcalls[i] := (e->>'calls')::bigint;
    lper[i] := (e->>'perMs')::bigint;
    lconc[i] := (e->>'concurrent')::bigint;
    lref[i] := (e->>'refill')::bigint;
    lburst[i] := coalesce((e->>'burst')::bigint, lref[i]);
    linit[i] := coalesce((e->>'initial')::bigint, lburst[i]);
    -- the cost counted: capped at calls, or at a token bucket's burst
    lcost[i] := CASE WHEN lcalls[i] IS NOT NULL
                     THEN least(coalesce((e->>'cost')::bigint, (req->>'cost')::bigint, 1), lcalls[i])
                     WHEN lref[i] IS NOT NULL
                     THEN least(coalesce((e->>'cost')::bigint, (req->>'cost')::bigint, 1), lburst[i])
                     ELSE 0 END;
  END LOOP;
  IF req ? 'ticket' THEN
    SELECT * INTO t FROM __SCHEMA__.tickets WHERE ticket = req->>'ticket';
    v_have := FOUND;
  END IF;

  LOOP
    IF v_locked THEN
      -- Pass 2: the ticket, then every bucket in key order (a missing row is created: the lock
      -- of a line with no grant yet). Ended meanwhile, the ticket is unknown.
      IF v_have THEN
        SELECT * INTO t FROM __SCHEMA__.tickets WHERE num = t.num FOR UPDATE;
        v_have := FOUND;
      END IF;
      FOR v_key IN SELECT k FROM unnest(lk) AS k ORDER BY k COLLATE "C" LOOP
        INSERT INTO __SCHEMA__.buckets AS bk (key) VALUES (v_key)
        ON CONFLICT (key) DO UPDATE SET key = excluded.key WHERE false;
      END LOOP;
    END IF;
    SELECT greatest(coalesce(at_ms, __SCHEMA__._clock_ms()), coalesce(max(bk.floor_ms), 0)) INTO v_now
      FROM __SCHEMA__.buckets bk WHERE bk.key = ANY (lk);
    v_mine := NULL;
    IF v_have THEN
      IF t.lapse_at <= v_now THEN
        IF NOT v_peek AND NOT t.counted THEN
          UPDATE __SCHEMA__.tickets SET counted = true WHERE num = t.num AND NOT counted;
          GET DIAGNOSTICS v_rows = ROW_COUNT;
          v_lapsed := v_lapsed OR v_rows > 0;
          t.counted := true;
        END IF;
      ELSIF t.caller IS DISTINCT FROM req->>'key' OR t.bound <> __SCHEMA__._bound(req) THEN
        RAISE EXCEPTION 'ticket was filed for another request: the caller key and the limits (key, calls, refill, perMs, burst, initial, cost, concurrent, holdMs) must be the ones it was filed with'
          USING ERRCODE = 'RL400';
      ELSE
        v_mine := t.num;
      END IF;
    END IF;

    -- Rule Q: the line refusal that stands, per limit in request order (strictly later wins).
    v_lat := NULL;
    v_lidx := NULL;
    FOR i IN 1 .. n LOOP
      v_at := __SCHEMA__._line_refusal(lk[i], v_now, v_mine, lcalls[i], lper[i], lcost[i], lconc[i], recheck_ms,
                                       lref[i], lburst[i], linit[i]);
      IF v_at IS NOT NULL AND (v_lat IS NULL OR v_at > v_lat) THEN
        v_lat := v_at;
        v_lidx := i - 1;
      END IF;
    END LOOP;
    -- The request's own refusal at the same instant (the horizon's measure too).
    v_own := __SCHEMA__._acquire_plain(v_decided, 'peek', recheck_ms, permit_id, v_now);
    v_refused := NOT (v_own->>'fits')::boolean;
    v_own_at := CASE WHEN v_refused THEN (v_own->>'retryAt')::bigint ELSE v_now END;
    v_retry := (v_own->>'retryAt')::bigint;
    v_reason := v_own->>'reason';
    v_limit := v_own->>'limit';
    IF v_lat IS NOT NULL THEN
      v_oidx := NULL;
      IF v_refused AND v_reason <> 'throttle' THEN
        SELECT x.ord - 1 INTO v_oidx
          FROM jsonb_array_elements(v_limits) WITH ORDINALITY AS x(v, ord)
         WHERE x.v->>'key' = v_limit
         ORDER BY x.ord LIMIT 1;
      END IF;
      IF NOT v_refused OR v_lat > v_retry
         OR (v_lat = v_retry AND v_reason <> 'throttle'
             AND (v_lidx < v_oidx OR (v_lidx = v_oidx AND v_reason = 'concurrency'))) THEN
        v_refused := true;
        v_retry := v_lat;
        v_reason := CASE WHEN lcalls[v_lidx + 1] IS NOT NULL OR lref[v_lidx + 1] IS NOT NULL THEN 'rate'
                         ELSE 'concurrency' END;
        v_limit := lk[v_lidx + 1];
      END IF;
    END IF;
    EXIT WHEN v_peek OR v_locked;
    -- What writes more than a renewal is decided again under the locks; a line full on the
    -- snapshot (rare, and a refusal either way) files nothing and needs no lock.
    EXIT WHEN v_refused AND NOT (v_mine IS NULL AND v_inline AND v_reason <> 'throttle'
                                 AND v_own_at <= v_now + v_horizon
                                 AND NOT __SCHEMA__._line_full(lk, v_now));
    v_locked := true;
  END LOOP;

  IF v_peek THEN
    v_reply := v_own;
    IF v_refused THEN
      v_reply := v_reply || jsonb_build_object('fits', false, 'retryAt', v_retry, 'reason', v_reason,
                                               'limit', v_limit);
    END IF;
  ELSE
    IF NOT v_refused THEN
      v_reply := __SCHEMA__._acquire_plain(v_decided, mode, recheck_ms, permit_id, at_ms);
      IF (v_reply->>'granted')::boolean THEN
        v_now := greatest(v_now, (v_reply->>'now')::bigint);
        IF v_mine IS NOT NULL THEN
          PERFORM __SCHEMA__._end_ticket_as(v_mine, true);
          v_reply := v_reply || jsonb_build_object('waitedMs', (v_reply->>'at')::bigint - t.filed_at);
        END IF;
      ELSE
        -- refused after all (a throttle set meanwhile): as any refusal below
        v_refused := true;
        v_retry := (v_reply->>'retryAt')::bigint;
        v_reason := v_reply->>'reason';
        v_limit := v_reply->>'limit';
      END IF;
    END IF;
    IF v_refused THEN
      IF v_reply IS NULL THEN
        v_reply := jsonb_build_object('granted', false, 'retryAt', v_retry, 'reason', v_reason,
                                      'limit', v_limit, 'now', v_now);
        IF mode = 'report' THEN
          v_reply := v_reply || jsonb_build_object('limits', v_own->'limits');
        END IF;
      END IF;
      IF v_mine IS NOT NULL THEN
        -- Renewed: it keeps its place (the ticket first, then any bucket: the lock order).
        v_lapse := greatest(least(v_retry + v_grace, t.deadline), v_now + 1);
        IF pg_current_xact_id_if_assigned() IS NULL THEN
          -- Nothing else written: a renewal may be lost in a crash (12.6), so its commit does
          -- not wait for the WAL flush. A host asking again while it waits costs no fsync.
          PERFORM set_config('synchronous_commit', 'off', true);
        END IF;
        UPDATE __SCHEMA__.tickets SET retry_at = v_retry, lapse_at = v_lapse, grace_ms = v_grace
         WHERE num = v_mine;
        GET DIAGNOSTICS v_rows = ROW_COUNT;
        IF v_rows = 0 THEN
          -- Ended meanwhile (granted or left through another session): now unknown.
          RETURN __SCHEMA__._acquire_line(req, mode, recheck_ms, permit_id, at_ms);
        END IF;
        UPDATE __SCHEMA__.line q SET lapse_at = v_lapse WHERE q.bucket = ANY (t.keys) AND q.num = v_mine;
        v_num := v_mine;
      ELSIF v_inline AND v_reason <> 'throttle' THEN
        IF v_own_at > v_now + v_horizon THEN
          v_no := 'horizon';
        ELSIF __SCHEMA__._line_full(lk, v_now) THEN
          v_no := 'full';
        ELSE
          -- Filed under every bucket's lock (pass 2): its number, its instant and its place in
          -- each line agree.
          v_num := nextval('__SCHEMA__.ticket_numbers');
          v_ticket := replace(gen_random_uuid()::text, '-', '');
          -- 64 random bits: the uuid's hex digits but its version and variant digits
          v_ticket := 't-' || substr(v_ticket, 1, 12) || substr(v_ticket, 14, 3) || substr(v_ticket, 18, 1)
                      || lpad(to_hex(v_num), 16, '0');
          v_lapse := least(v_retry + v_grace, v_now + v_horizon);
          INSERT INTO __SCHEMA__.tickets (num, ticket, caller, bound, keys, retry_at, lapse_at, grace_ms,
                                          filed_at, deadline)
          VALUES (v_num, v_ticket, req->>'key', __SCHEMA__._bound(req), lk, v_retry, v_lapse, v_grace,
                  v_now, v_now + v_horizon);
          FOR i IN 1 .. n LOOP
            e := v_limits->(i - 1);
            -- a ceiling forgotten with its idle bucket stays forgotten once the line brings the
            -- bucket back (section 14), whether or not this ticket adapts
            DELETE FROM __SCHEMA__.ceilings ce
             WHERE ce.key = lk[i] AND (__SCHEMA__._kept_ceiling(lk[i], v_now)).key IS NULL;
            IF e ? 'adapt' THEN
              -- its own figures, judged with the ceiling at each walk (section 14)
              e := e - 'adaptOwn' || (e->'adaptOwn');
              INSERT INTO __SCHEMA__.line (bucket, num, lapse_at, caller, calls, per_ms, cost, conc, refill,
                                           burst, initial, adapt_min, adapt_max, asked_cost)
              VALUES (lk[i], v_num, v_lapse, req->>'key', coalesce((e->>'calls')::bigint, 0), coalesce(lper[i], 0),
                      lcost[i], coalesce(lconc[i], 0), coalesce((e->>'refill')::bigint, 0),
                      coalesce((e->>'burst')::bigint, (e->>'refill')::bigint, 0),
                      coalesce((e->>'initial')::bigint, (e->>'burst')::bigint, (e->>'refill')::bigint, 0),
                      (e->'adapt'->>'min')::bigint, (e->'adapt'->>'max')::bigint,
                      coalesce((e->>'cost')::bigint, (req->>'cost')::bigint, 1));
            ELSE
              INSERT INTO __SCHEMA__.line (bucket, num, lapse_at, caller, calls, per_ms, cost, conc, refill,
                                           burst, initial)
              VALUES (lk[i], v_num, v_lapse, req->>'key', coalesce(lcalls[i], 0), coalesce(lper[i], 0),
                      lcost[i], coalesce(lconc[i], 0), coalesce(lref[i], 0), coalesce(lburst[i], 0),
                      coalesce(linit[i], 0));
            END IF;
          END LOOP;
          UPDATE __SCHEMA__.buckets SET queued = queued + 1, floor_ms = greatest(floor_ms, v_now)
           WHERE key = ANY (lk);
        END IF;
      END IF;
      PERFORM __SCHEMA__._lengthen(req, v_now, at_ms);
      IF v_num IS NOT NULL THEN
        v_reply := v_reply || jsonb_build_object(
          'ticket', (SELECT tk.ticket FROM __SCHEMA__.tickets tk WHERE tk.num = v_num),
          'lapseAt', v_lapse, 'ahead', __SCHEMA__._ahead(v_num, v_now), 'now', v_now);
      ELSIF v_no IS NOT NULL THEN
        v_reply := v_reply || jsonb_build_object('noTicket', v_no);
      END IF;
    END IF;
  END IF;

  IF v_lapsed THEN
    v_reply := v_reply || jsonb_build_object('lapsedTicket', true);
  END IF;
  IF v_reply ? 'limits' THEN
    SELECT jsonb_agg(CASE WHEN v_inline OR x.n > 0 THEN x.f || jsonb_build_object('queued', x.n) ELSE x.f END
                     ORDER BY x.ord) INTO v_figs
      FROM (SELECT f.v AS f, f.ord, __SCHEMA__._queued(f.v->>'key', v_now) AS n
              FROM jsonb_array_elements(v_reply->'limits') WITH ORDINALITY AS f(v, ord)) x;
    v_reply := v_reply || jsonb_build_object('limits', coalesce(v_figs, '[]'::jsonb));
  END IF;
  RETURN v_reply;
END
$$;
COMMENT ON FUNCTION __SCHEMA__._acquire_line(jsonb, text, bigint, text, bigint) IS
  'acquire, report or peek under rule Q (wire sections 12 and 12.9): files, renews and ends tickets';

-- release {ticket} (12.4): true when a live ticket left its lines; a lapsed one ends too.
CREATE OR REPLACE FUNCTION __SCHEMA__.leave(p_ticket text, at_ms bigint DEFAULT NULL) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  t record;
BEGIN
  SELECT num, lapse_at INTO t FROM __SCHEMA__.tickets WHERE ticket = p_ticket FOR UPDATE;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM __SCHEMA__._end_ticket(t.num);
  RETURN t.lapse_at > coalesce(at_ms, __SCHEMA__._clock_ms());
END
$$;
COMMENT ON FUNCTION __SCHEMA__.leave(text, bigint) IS 'release {ticket}: leave every line (section 12.4)';

-- A server's start is a restart for the line (12.6): every ticket that had not lapsed at the
-- database's latest instant (the latest a server was seen at, or a bucket's floor) keeps its
-- place and lapses no sooner than now plus its grace (its deadline moved as far), so hosts
-- whose places would have lapsed while every server was down reach a server again in time.
-- How many tickets it kept so.
CREATE OR REPLACE FUNCTION __SCHEMA__.resume_line(at_ms bigint DEFAULT NULL) RETURNS integer
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_latest bigint;
  v_n integer;
BEGIN
  SELECT greatest(m.alive_at, coalesce((SELECT max(bk.floor_ms) FROM __SCHEMA__.buckets bk), 0))
    INTO v_latest FROM __SCHEMA__.meta m;
  WITH kept AS (
    UPDATE __SCHEMA__.tickets t
       SET lapse_at = v_now + t.grace_ms, deadline = greatest(t.deadline, v_now + t.grace_ms)
     WHERE t.lapse_at > v_latest AND t.lapse_at < v_now + t.grace_ms AND NOT t.counted
    RETURNING t.num, t.keys, t.lapse_at
  ), lines AS (
    UPDATE __SCHEMA__.line q SET lapse_at = kept.lapse_at FROM kept
     WHERE q.bucket = ANY (kept.keys) AND q.num = kept.num
    RETURNING 1
  )
  SELECT count(*)::integer INTO v_n FROM kept;
  UPDATE __SCHEMA__.meta SET alive_at = greatest(alive_at, v_now);
  RETURN v_n;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.resume_line(bigint) IS
  'a server''s start: tickets live at the latest instant keep their place, lapsing no sooner than now + grace (12.6)';

-- /wait (wire section 15): how each ticket of p_tickets stands at now, in one round trip: gone
-- (unknown, ended or lapsed), ready (its request, asked with it now, would be granted: a peek of
-- _acquire_line() with the ticket, rule Q and 12.9 included, so the database decides it as it
-- decides the acquire), or not yet, with the retryAt that peek tells it and the keys a change
-- wakes it by (its buckets and its caller: _wake()). With p_hold_ms, when no ticket is ready or
-- gone (the wait goes on), each ticket is held from lapsing until now + p_hold_ms + its grace,
-- never past its deadline (12.9): a renewal's write, which may be lost in a crash (12.6), so it
-- commits without waiting for the WAL flush. Answers {"now", "tickets": [{"s": "r" | "g" |
-- "n", "retryAt", "keys"}, ...]} in the order of p_tickets. Reads only, but for the hold.
CREATE OR REPLACE FUNCTION __SCHEMA__.wait_check(p_tickets text[], p_hold_ms bigint, recheck_ms bigint,
                                                 at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_ticket text;
  t record;
  v_peek jsonb;
  v_out jsonb := '[]'::jsonb;
  v_waiting bigint[] := '{}';
  v_over boolean := false;
BEGIN
  FOREACH v_ticket IN ARRAY p_tickets LOOP
    SELECT tk.num, tk.caller, tk.bound, tk.keys, tk.lapse_at INTO t
      FROM __SCHEMA__.tickets tk WHERE tk.ticket = v_ticket;
    IF NOT FOUND OR t.lapse_at <= v_now THEN
      v_out := v_out || jsonb_build_array(jsonb_build_object('s', 'g'));
      v_over := true;
      CONTINUE;
    END IF;
    v_peek := __SCHEMA__._acquire_line(__SCHEMA__._judged(
      jsonb_build_object('key', t.caller, 'limits', t.bound, 'ticket', v_ticket), v_now), 'peek', recheck_ms, '', at_ms);
    IF (v_peek->>'fits')::boolean THEN
      v_out := v_out || jsonb_build_array(jsonb_build_object('s', 'r'));
      v_over := true;
    ELSE
      v_out := v_out || jsonb_build_array(jsonb_build_object(
        's', 'n', 'retryAt', (v_peek->>'retryAt')::bigint, 'keys', to_jsonb(t.keys || t.caller)));
      v_waiting := v_waiting || t.num;
    END IF;
  END LOOP;
  IF p_hold_ms IS NOT NULL AND NOT v_over AND cardinality(v_waiting) > 0 THEN
    PERFORM set_config('synchronous_commit', 'off', true);
    WITH held AS (
      UPDATE __SCHEMA__.tickets tk SET lapse_at = least(v_now + p_hold_ms + tk.grace_ms, tk.deadline)
       WHERE tk.num = ANY (v_waiting) AND tk.lapse_at < least(v_now + p_hold_ms + tk.grace_ms, tk.deadline)
      RETURNING tk.num, tk.keys, tk.lapse_at
    )
    UPDATE __SCHEMA__.line q SET lapse_at = held.lapse_at FROM held
     WHERE q.bucket = ANY (held.keys) AND q.num = held.num;
  END IF;
  RETURN jsonb_build_object('now', v_now, 'tickets', v_out);
END
$$;
COMMENT ON FUNCTION __SCHEMA__.wait_check(text[], bigint, bigint, bigint) IS
  '/wait (section 15): whether each ticket is ready, gone or not yet (until when, woken by which keys); holds waited tickets';

-- The writing half of the server's one-statement acquire of one window limit
-- (acquire_window.sql, beside this script), called by that statement only when it does not
-- refuse. p_grant: the statement's snapshot decided a grant; p_xm, p_now, p_total and p_seq
-- are what it read (the bucket row's version, now, its total and newest sequence number).
-- A grant writes the bucket row only if nobody changed it since (as acquire() does), then the
-- grant row, and answers NULL. Otherwise (a changed row, or a request the statement leaves
-- to the general path) it answers acquire()'s reply for the same request.
-- It never waits for a row with xmax set (another transaction writing or locking it, or a
-- lock of a committed one, which the row's next plain update clears): such a grant was
-- usually decided on a row about to change, and waiting here would hold the row's lock
-- through acquire()'s whole decision afterwards, serialising a hot bucket's callers on that;
-- acquire() then decides and waits as it always did.
CREATE OR REPLACE FUNCTION __SCHEMA__._acquire_window(p_grant boolean, p_key text, p_calls bigint,
                                                      p_per bigint, p_cost bigint, p_caller text,
                                                      p_at_ms bigint, p_recheck bigint, p_hold bigint,
                                                      p_lhold bigint, p_xm xid, p_now bigint,
                                                      p_total bigint, p_seq bigint)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
BEGIN
  IF p_grant THEN
    WITH u AS (
      UPDATE __SCHEMA__.buckets AS bk
         SET total = p_total + least(p_cost, p_calls), last_seq = p_seq + 1, last_at = p_now,
             floor_ms = greatest(bk.floor_ms, p_now), last_calls = p_calls
       WHERE bk.key = p_key AND bk.xmin = p_xm AND bk.xmax = '0'::xid
      RETURNING bk.id
    )
    INSERT INTO __SCHEMA__.grants (bucket, at, seq, cost, cum)
    SELECT u.id, p_now, p_seq + 1, least(p_cost, p_calls), p_total + least(p_cost, p_calls) FROM u;
    IF FOUND THEN
      RETURN NULL;
    END IF;
    -- Changed since the read (the UPDATE then usually holds the row's lock): decide again.
  END IF;
  RETURN __SCHEMA__.acquire(
    jsonb_build_object('key', p_caller, 'holdMs', p_hold,
                       'limits', jsonb_build_array(jsonb_build_object(
                         'key', p_key, 'calls', p_calls, 'perMs', p_per, 'cost', p_cost, 'holdMs', p_lhold))),
    'acquire', p_recheck, '', p_at_ms);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._acquire_window(boolean, text, bigint, bigint, bigint, text, bigint, bigint,
                                               bigint, bigint, xid, bigint, bigint, bigint) IS
  'writes a grant of one window limit decided by the server''s one-statement acquire, else decides it';

-- The same for two or more window limits (acquire_windows.sql), the arrays in request order:
-- a grant locks every bucket row in key order (the one order of every multi-row lock) and
-- writes them and their grant rows only if none changed since the statement's read (p_xms),
-- then answers NULL. Otherwise it answers acquire()'s reply for the same request.
CREATE OR REPLACE FUNCTION __SCHEMA__._acquire_windows(p_grant boolean, p_keys text[], p_calls bigint[],
                                                       p_per bigint[], p_cost bigint[], p_caller text,
                                                       p_at_ms bigint, p_recheck bigint, p_hold bigint,
                                                       p_lholds bigint[], p_ids bigint[], p_xms xid[],
                                                       p_now bigint, p_totals bigint[], p_seqs bigint[])
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_same integer;
BEGIN
  IF p_grant THEN
    SELECT count(*) FILTER (WHERE s.same) INTO v_same
      FROM (SELECT bk.xmin = x.xm AS same
              FROM __SCHEMA__.buckets bk
              JOIN unnest(p_keys, p_xms) AS x(key, xm) ON bk.key = x.key
             ORDER BY bk.key
               FOR UPDATE OF bk) s;
    IF v_same = cardinality(p_keys) THEN
      UPDATE __SCHEMA__.buckets AS bk
         SET total = x.total + least(x.cost, x.calls), last_seq = x.seq + 1, last_at = p_now,
             floor_ms = greatest(bk.floor_ms, p_now), last_calls = x.calls
        FROM unnest(p_keys, p_totals, p_seqs, p_cost, p_calls) AS x(key, total, seq, cost, calls)
       WHERE bk.key = x.key;
      INSERT INTO __SCHEMA__.grants (bucket, at, seq, cost, cum)
      SELECT x.id, p_now, x.seq + 1, least(x.cost, x.calls), x.total + least(x.cost, x.calls)
        FROM unnest(p_ids, p_totals, p_seqs, p_cost, p_calls) AS x(id, total, seq, cost, calls);
      RETURN NULL;
    END IF;
    -- Changed since the read (the rows stay locked): decide again.
  END IF;
  RETURN __SCHEMA__.acquire(
    jsonb_build_object('key', p_caller, 'holdMs', p_hold, 'limits',
      (SELECT jsonb_agg(jsonb_build_object('key', x.key, 'calls', x.calls, 'perMs', x.per, 'cost', x.cost,
                                           'holdMs', x.hold) ORDER BY x.ord)
         FROM unnest(p_keys, p_calls, p_per, p_cost, p_lholds) WITH ORDINALITY AS x(key, calls, per, cost, hold, ord))),
    'acquire', p_recheck, '', p_at_ms);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._acquire_windows(boolean, text[], bigint[], bigint[], bigint[], text, bigint,
                                                bigint, bigint, bigint[], bigint[], xid[], bigint, bigint[],
                                                bigint[]) IS
  'writes a grant of several window limits decided by the server''s one-statement acquire, else decides it';


---------------------------------------------------------------------------------------------
-- The settle of a grant made at p_at (9.3): its window shares p_windows ([{"k": key, "b":
-- buckets.id, "calls", "per", "cost"}], as permits.windows keeps them) take the costs given
-- (every key among them: the callers check), each capped at its calls, at p_clock (floored by
-- the buckets). The buckets are locked in key order (the same order as acquire). Answers
-- {"windows": the shares with their new costs, "changed": whether a window counts otherwise}.
-- A share whose bucket was forgotten and created again since the grant ("b" another id; a share
-- without "b", a request id's, is settled in the bucket of its key, as the engine settles it),
-- whose grant row is gone or has left the bucket's kept window, changes nothing there. A token
-- bucket's share ({"k", "refill", "per", "burst", "cost"}, section 13) takes its cost capped at
-- burst, and the difference goes back into its level (never above burst) or is taken from it
-- (below 0 in debt), whatever became of the bucket since. A settle down in a bucket with a line
-- wakes it (_wake).
CREATE OR REPLACE FUNCTION __SCHEMA__._settle_grant(p_at bigint, p_windows jsonb, costs jsonb,
                                                    p_clock bigint)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  b record;
  e record;
  v_now bigint;
  v_keys text[];
  v_win jsonb;
  v_windows jsonb := p_windows;
  v_pos integer;
  v_new bigint;
  v_d bigint;
  v_seq bigint;
  v_r bigint;
  v_w bigint;
  v_changed boolean := false;
  v_wake text[] := '{}';
  v_key text;
  v_queued bigint;
BEGIN
  SELECT array_agg(x.key ORDER BY x.key COLLATE "C") INTO v_keys
    FROM jsonb_to_recordset(costs) AS x(key text);
  -- Lock the buckets in key order (the same order as acquire). A token bucket's row is created
  -- when missing: its level is written under that lock.
  IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_windows) w WHERE w ? 'refill') THEN
    FOR v_key IN SELECT k FROM unnest(v_keys) AS k ORDER BY k COLLATE "C" LOOP
      IF EXISTS (SELECT 1 FROM jsonb_array_elements(p_windows) w WHERE w->>'k' = v_key AND w ? 'refill') THEN
        INSERT INTO __SCHEMA__.buckets AS bk (key) VALUES (v_key)
        ON CONFLICT (key) DO UPDATE SET key = excluded.key WHERE false;
      ELSE
        PERFORM 1 FROM __SCHEMA__.buckets WHERE key = v_key FOR UPDATE;
      END IF;
    END LOOP;
  ELSE
    PERFORM 1 FROM __SCHEMA__.buckets WHERE key = ANY (v_keys) ORDER BY key FOR UPDATE;
  END IF;
  SELECT greatest(p_clock, p_at, max(floor_ms)) INTO v_now
    FROM __SCHEMA__.buckets WHERE key = ANY (v_keys);
  FOR e IN SELECT x.key, x.cost FROM jsonb_to_recordset(costs) AS x(key text, cost bigint) LOOP
    SELECT w.value, w.ord::integer - 1 INTO v_win, v_pos
      FROM jsonb_array_elements(v_windows) WITH ORDINALITY AS w(value, ord)
     WHERE w.value->>'k' = e.key;
    IF v_win ? 'refill' THEN
      v_new := least(e.cost, (v_win->>'burst')::bigint);
      CONTINUE WHEN v_new = (v_win->>'cost')::bigint;
      v_windows := jsonb_set(v_windows, ARRAY[v_pos::text, 'cost'], to_jsonb(v_new));
      PERFORM __SCHEMA__._lv_write(e.key, __SCHEMA__._lv_settle(__SCHEMA__._lv_live(e.key, v_now),
        (v_win->>'refill')::bigint, (v_win->>'per')::bigint, (v_win->>'burst')::bigint,
        (v_win->>'cost')::bigint, v_new, v_now));
      UPDATE __SCHEMA__.buckets SET floor_ms = greatest(floor_ms, v_now) WHERE key = e.key
      RETURNING queued INTO v_queued;
      v_changed := true;
      IF v_new < (v_win->>'cost')::bigint AND v_queued > 0 THEN
        v_wake := v_wake || e.key;  -- tokens came back where tickets wait
      END IF;
      CONTINUE;
    END IF;
    v_new := least(e.cost, (v_win->>'calls')::bigint);
    v_d := v_new - (v_win->>'cost')::bigint;
    v_windows := jsonb_set(v_windows, ARRAY[v_pos::text, 'cost'], to_jsonb(v_new));
    CONTINUE WHEN v_d = 0;
    SELECT * INTO b FROM __SCHEMA__.buckets WHERE key = e.key;
    -- A bucket forgotten and created again since the grant no longer holds it.
    CONTINUE WHEN NOT FOUND OR b.id <> coalesce((v_win->>'b')::bigint, b.id);
    SELECT g.seq INTO v_seq FROM __SCHEMA__.grants g WHERE g.bucket = b.id AND g.at = p_at;
    CONTINUE WHEN NOT FOUND;
    v_r := b.retain_ms;
    v_w := b.pruned_to;
    IF __SCHEMA__._idle(b.id, v_now, b.retain_ms, b.pruned_to, b.total, b.dtotal, b.fen) THEN
      -- Forgotten since: it starts afresh holding this grant, kept for the grant's perMs.
      IF v_r > 0 THEN
        v_w := greatest(v_w, v_now - v_r);
      END IF;
      v_r := (v_win->>'per')::bigint;
    END IF;
    -- A grant that has left the bucket's kept window changes nothing there.
    CONTINUE WHEN p_at <= greatest(v_w, v_now - v_r);
    INSERT INTO __SCHEMA__.fen AS f (bucket, idx, d)
    SELECT b.id, x, v_d FROM unnest(__SCHEMA__._fen_up(v_seq, b.last_seq)) AS x
    ON CONFLICT (bucket, idx) DO UPDATE SET d = f.d + excluded.d;
    UPDATE __SCHEMA__.buckets
       SET dtotal = dtotal + v_d, fen = true, retain_ms = v_r, pruned_to = v_w
     WHERE id = b.id;
    v_changed := true;
    IF v_d < 0 AND b.queued > 0 THEN
      v_wake := v_wake || e.key;  -- room came back where tickets wait
    END IF;
  END LOOP;
  IF cardinality(v_wake) > 0 THEN
    PERFORM __SCHEMA__._wake(v_wake);
  END IF;
  RETURN jsonb_build_object('windows', v_windows, 'changed', v_changed);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._settle_grant(bigint, jsonb, jsonb, bigint) IS
  'settle the window shares of a grant (spec 9.3), for settle and release {id}';

-- settle: {"settled": true|false}; raises RL400 naming costs[i].key for a key that was not a
-- window limit of the live permit's grant (and then changes nothing).
-- costs: [{"key", "cost"}], 1-64 entries with unique keys.
CREATE OR REPLACE FUNCTION __SCHEMA__.settle(permit text, costs jsonb, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  p record;
  e record;
  v_clock bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_settled jsonb;
BEGIN
  SELECT * INTO p FROM __SCHEMA__.permits WHERE id = permit FOR UPDATE;
  IF NOT FOUND OR p.lapse <= greatest(v_clock, p.at) THEN
    RETURN jsonb_build_object('settled', false);
  END IF;
  -- All or nothing: check every key before changing anything.
  FOR e IN SELECT x.key, x.ord
             FROM ROWS FROM (jsonb_to_recordset(costs) AS (key text)) WITH ORDINALITY AS x(key, ord)
            ORDER BY x.ord LOOP
    IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(p.windows) w WHERE w->>'k' = e.key) THEN
      RAISE EXCEPTION 'costs[%].key is not a window limit of the permit''s grant', e.ord - 1
        USING ERRCODE = 'RL400', DETAIL = e.key;
    END IF;
  END LOOP;
  v_settled := __SCHEMA__._settle_grant(p.at, p.windows, costs, v_clock);
  UPDATE __SCHEMA__.permits SET windows = v_settled->'windows' WHERE id = permit;
  RETURN jsonb_build_object('settled', true);
END
$$;
COMMENT ON FUNCTION __SCHEMA__.settle(text, jsonb, bigint) IS
  'settle a live permit''s window costs (spec 9.3); RL400 names a key that was not a window limit';

---------------------------------------------------------------------------------------------
-- release: true when the permit was live (its places freed, no longer settleable; the lines of
-- their buckets woken). With costs, settles first, in the same transaction (spec 9.3).
CREATE OR REPLACE FUNCTION __SCHEMA__.release(permit text, costs jsonb DEFAULT NULL,
                                              at_ms bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  p record;
  i integer;
  v_clock bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
BEGIN
  IF costs IS NOT NULL THEN
    PERFORM __SCHEMA__.settle(permit, costs, at_ms);
  END IF;
  DELETE FROM __SCHEMA__.permits WHERE id = permit RETURNING * INTO p;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  -- (one primary-key delete per place: a join with unnest would be planned on every call)
  FOR i IN 1 .. cardinality(p.place_buckets) LOOP
    DELETE FROM __SCHEMA__.places pl
     WHERE pl.bucket = p.place_buckets[i] AND pl.lapse = p.place_lapses[i] AND pl.permit = p.id;
  END LOOP;
  IF p.lapse <= greatest(v_clock, p.at) THEN
    RETURN false;
  END IF;
  IF cardinality(p.place_buckets) > 0 THEN
    -- Places came back: the lines waiting for them are woken.
    PERFORM __SCHEMA__._wake(ARRAY(SELECT bk.key FROM __SCHEMA__.buckets bk
                                    WHERE bk.id = ANY (p.place_buckets) AND bk.queued > 0));
  END IF;
  RETURN true;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.release(text, jsonb, bigint) IS
  'release a permit (section 4), settling first when costs are given (9.3)';

---------------------------------------------------------------------------------------------
-- Outcomes (wire section 14; table ceilings). The engine's engine/ceiling.rs, rule for rule:
--   An outcome counts on a live permit, once per adapted bucket of its grant (the permit keeps
--   which were signalled); a later one, or one for an unknown, released or lapsed permit,
--   changes nothing. `limited` cuts C to max(min, floor(C x keepPct / 100)), and `clean` grows
--   it by increase up to max when the ceiling was in play at the grant and has not grown within
--   the last perMs; both only for a grant after the latest cut: made in a later millisecond,
--   or in the cut's own millisecond having seen that cut counted (cuts). A ceiling none kept
--   starts at the request's own calls (refill) and is written only when an outcome changed it.
--   The permit's row is locked first, then each bucket's ceiling (a transaction lock on its
--   key, in key order), and C is read after the lock.
-- Answers {"cuts": n, "growths": n} (for the server's metrics); p_outcome is 'clean' or
-- 'limited'; p_now the instant (the database's clock when NULL).
CREATE OR REPLACE FUNCTION __SCHEMA__._signal(p_permit text, p_outcome text, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  p record;
  a jsonb;
  v_now bigint;
  v_out jsonb := '[]';
  k record;
  v_found boolean;
  v_c bigint;
  v_next bigint;
  v_cut_at bigint;
  v_cuts bigint;
  v_grown bigint;
  v_after boolean;
  v_change text;
  v_ncut integer := 0;
  v_ngrow integer := 0;
BEGIN
  SELECT * INTO p FROM __SCHEMA__.permits WHERE id = p_permit FOR UPDATE;
  v_now := greatest(coalesce(at_ms, __SCHEMA__._clock_ms()), p.at);
  IF NOT FOUND OR p.adapted IS NULL OR p.lapse <= v_now THEN
    RETURN jsonb_build_object('cuts', 0, 'growths', 0);
  END IF;
  FOR a IN SELECT x.v FROM jsonb_array_elements(p.adapted) AS x(v) ORDER BY x.v->>'k' COLLATE "C" LOOP
    IF (a->>'sig')::boolean THEN
      v_out := v_out || jsonb_build_array(a);
      CONTINUE;
    END IF;
    PERFORM pg_advisory_xact_lock(hashtext('redb-limiter ceilings __SCHEMA__'), hashtext(a->>'k'));
    SELECT ce.c, ce.cut_at, ce.cuts, ce.grown_at INTO k FROM __SCHEMA__._kept_ceiling(a->>'k', v_now) ce;
    v_found := k.c IS NOT NULL;
    v_c := least(greatest(CASE WHEN v_found THEN k.c ELSE (a->>'start')::bigint END, (a->>'min')::bigint),
                 (a->>'max')::bigint);
    v_next := CASE WHEN v_found THEN k.c ELSE (a->>'start')::bigint END;
    v_cut_at := CASE WHEN v_found THEN k.cut_at END;
    IF v_found THEN
      v_cuts := k.cuts;
    ELSE
      -- Kept anew: its count starts above what any live grant of this millisecond saw of the
      -- ceiling forgotten before it, so that those grants stay before its cuts.
      SELECT coalesce(max((x.v->>'cuts')::bigint), 0) INTO v_cuts
        FROM __SCHEMA__.permits pm CROSS JOIN LATERAL jsonb_array_elements(pm.adapted) AS x(v)
       WHERE pm.at = v_now AND pm.adapted IS NOT NULL AND pm.lapse > v_now AND x.v->>'k' = a->>'k';
    END IF;
    v_grown := CASE WHEN v_found THEN k.grown_at END;
    v_after := v_cut_at IS NULL OR p.at > v_cut_at OR (p.at = v_cut_at AND (a->>'cuts')::bigint = v_cuts);
    v_change := NULL;
    IF p_outcome = 'limited' AND v_after THEN
      v_next := greatest(div(v_c::numeric * (a->>'keep')::bigint, 100)::bigint, (a->>'min')::bigint);
      v_cut_at := v_now;
      v_cuts := v_cuts + 1;
      v_change := 'cut';
      v_ncut := v_ncut + 1;
    ELSIF p_outcome = 'clean' AND v_after AND (a->>'inPlay')::boolean AND v_c < (a->>'max')::bigint
          AND (a->>'inc')::bigint > 0 AND (v_grown IS NULL OR v_now - v_grown >= (a->>'per')::bigint) THEN
      v_next := least(v_c + (a->>'inc')::bigint, (a->>'max')::bigint);
      v_grown := v_now;
      v_change := 'growth';
      v_ngrow := v_ngrow + 1;
    END IF;
    IF v_found OR v_change IS NOT NULL THEN
      INSERT INTO __SCHEMA__.ceilings AS ce (key, c, max, cut_at, cuts, grown_at, signal_at)
      VALUES (a->>'k', v_next, (a->>'max')::bigint, v_cut_at, v_cuts, v_grown, v_now)
      ON CONFLICT (key) DO UPDATE
         SET c = excluded.c, max = excluded.max, cut_at = excluded.cut_at, cuts = excluded.cuts,
             grown_at = excluded.grown_at, signal_at = excluded.signal_at;
    END IF;
    v_out := v_out || jsonb_build_array(a || '{"sig": true}'::jsonb);
  END LOOP;
  UPDATE __SCHEMA__.permits SET adapted = v_out WHERE id = p_permit;
  RETURN jsonb_build_object('cuts', v_ncut, 'growths', v_ngrow);
END
$$;
COMMENT ON FUNCTION __SCHEMA__._signal(text, text, bigint) IS
  'count an outcome (section 14) on a live permit''s adapted buckets: cut or grow their ceilings';

-- release with an outcome (section 14): settles first when costs are given, counts the
-- outcome, then releases, in one transaction. {"released": as release(), "cuts", "growths"}.
CREATE OR REPLACE FUNCTION __SCHEMA__.release_outcome(permit text, costs jsonb, outcome text,
                                                      at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_signal jsonb;
BEGIN
  IF costs IS NOT NULL THEN
    PERFORM __SCHEMA__.settle(permit, costs, at_ms);
  END IF;
  v_signal := __SCHEMA__._signal(permit, outcome, at_ms);
  RETURN v_signal || jsonb_build_object('released', __SCHEMA__.release(permit, NULL, at_ms));
END
$$;
COMMENT ON FUNCTION __SCHEMA__.release_outcome(text, jsonb, text, bigint) IS
  'release a permit (section 4) counting its outcome (section 14), settling first when costs are given';

-- settle with an outcome (section 14): the outcome counts when the permit was live.
-- settle()'s reply with "cuts" and "growths".
CREATE OR REPLACE FUNCTION __SCHEMA__.settle_outcome(permit text, costs jsonb, outcome text,
                                                     at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_reply jsonb := __SCHEMA__.settle(permit, costs, at_ms);
BEGIN
  IF (v_reply->>'settled')::boolean THEN
    RETURN v_reply || __SCHEMA__._signal(permit, outcome, at_ms);
  END IF;
  RETURN v_reply || jsonb_build_object('cuts', 0, 'growths', 0);
END
$$;
COMMENT ON FUNCTION __SCHEMA__.settle_outcome(text, jsonb, text, bigint) IS
  'settle a live permit (9.3) counting its outcome (section 14)';

---------------------------------------------------------------------------------------------
-- Request ids (wire section 16; table requests). An acquire or peek naming an id comes to
-- acquire_id() instead of acquire(), and release {id} to undo(): the server sends every other
-- request as before, so that one never reads the table. The engine's engine/requests.rs, rule
-- for rule:
--   An id is remembered once its acquire is granted or files a ticket (a renewal of the ticket
--   it presented files none), and once release {id} names it, seen or not; for 60 s at least,
--   for as long as the permit it got lives, and while the ticket it filed lives. What a record
--   keeps of the request is a digest of the params a retry must repeat (the caller key, the
--   limits as a ticket binds them, permit, queue and ticket; computed by the server as the
--   engine computes it), so report, graceMs and maxWaitMs may differ.
--   Every acquire and release {id} first takes a transaction lock on the id (an advisory lock
--   on its hash, in a key space of this schema's own, taken before any row lock, so it cannot
--   close a circle with the bucket locks): two sessions or servers presenting one id at once
--   decide one after the other, the second on a snapshot taken after the first committed, and
--   never both count. A lock and a read are all that a retry answered from its record costs,
--   and a refusal that files nothing writes nothing, as without an id. A record is written in
--   the transaction of the grant or filing it names, so it commits with it or not at all.

-- acquire, report or peek of a request named by p_id (escaped) whose params digest is
-- p_params; the other arguments and the reply as acquire()'s. A remembered id is answered as
-- the first time (the same grant at the same instant with the same permit, or the same refusal
-- naming the same ticket, with its lapse and the tickets ahead as they stand now; a report's
-- figures and a peek's as they stand now), counting and writing nothing, with "again": true;
-- one released, or remembered with other params, raises RL400 naming id. Otherwise acquire()
-- decides it, and a grant, or a refusal that filed a ticket, is remembered in the same
-- transaction. A peek takes no lock and writes nothing. Statements: the lock, the record's
-- read (and for a filing past its minute, its ticket's), then acquire()'s and the record's
-- write; each a statement of its own, so that the read's snapshot is taken after the lock.
CREATE OR REPLACE FUNCTION __SCHEMA__.acquire_id(req jsonb, mode text, recheck_ms bigint, permit_id text,
                                                 p_id text, p_params text, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  r record;
  v_now bigint;
  v_live boolean;
  v_reply jsonb;
  v_peek jsonb;
  v_num bigint;
  v_lapse bigint;
BEGIN
  IF mode <> 'peek' THEN
    PERFORM pg_advisory_xact_lock(hashtext('redb-limiter request ids __SCHEMA__'), hashtext(p_id));
  END IF;
  v_now := coalesce(at_ms, __SCHEMA__._clock_ms());
  SELECT * INTO r FROM __SCHEMA__.requests q WHERE q.id = p_id;
  -- Remembered until it has lived its time, and while the ticket it filed lives.
  v_live := FOUND AND r.until > v_now;
  IF FOUND AND r.outcome = 't' THEN
    SELECT t.num, t.lapse_at INTO v_num, v_lapse
      FROM __SCHEMA__.tickets t WHERE t.ticket = r.ticket AND t.lapse_at > v_now;
    v_live := v_live OR v_num IS NOT NULL;
  END IF;
  IF v_live THEN
    IF r.outcome = 'r' THEN
      RAISE EXCEPTION 'id was released: a new ask needs a new id' USING ERRCODE = 'RL400';
    END IF;
    IF r.params <> p_params THEN
      RAISE EXCEPTION 'id names another request: a retry must repeat its key, limits, permit, queue and ticket'
        USING ERRCODE = 'RL400';
    END IF;
    IF r.outcome = 'g' THEN
      v_reply := jsonb_build_object('granted', true, 'at', r.at, 'permit', r.permit, 'now', v_now);
    ELSE
      v_reply := jsonb_build_object('granted', false, 'retryAt', r.retry_at, 'reason', r.reason,
                                    'limit', r.lim, 'now', v_now, 'ticket', r.ticket,
                                    'lapseAt', coalesce(v_lapse, r.lapse_at),
                                    'ahead', CASE WHEN v_num IS NULL THEN 0 ELSE __SCHEMA__._ahead(v_num, v_now) END);
    END IF;
    IF mode = 'acquire' THEN
      RETURN v_reply || '{"again": true}'::jsonb;
    END IF;
    -- The figures as they stand now: a peek of the same request.
    v_peek := __SCHEMA__.acquire(req, 'peek', recheck_ms, '', v_now);
    IF mode = 'report' THEN
      RETURN v_reply || jsonb_build_object('limits', v_peek->'limits', 'again', true);
    ELSIF r.outcome = 'g' THEN
      RETURN (v_peek - 'retryAt' - 'reason' - 'limit') || jsonb_build_object('fits', true, 'now', v_now);
    END IF;
    RETURN v_peek || jsonb_build_object('fits', false, 'retryAt', r.retry_at, 'reason', r.reason,
                                        'limit', r.lim, 'now', v_now);
  END IF;

  v_reply := __SCHEMA__.acquire(req, mode, recheck_ms, permit_id, at_ms);
  IF mode = 'peek'
     OR (NOT (v_reply->>'granted')::boolean
         AND (NOT v_reply ? 'ticket' OR v_reply->>'ticket' IS NOT DISTINCT FROM req->>'ticket')) THEN
    RETURN v_reply;  -- a refusal that filed nothing (or renewed its ticket): decided afresh if asked again
  END IF;
  v_now := (v_reply->>'now')::bigint;
  IF current_setting('synchronous_commit') = 'off' THEN
    -- (a renewal that found its ticket ended and filed anew may have turned it off)
    SET LOCAL synchronous_commit TO DEFAULT;
  END IF;
  -- A grant is remembered for a minute and as long as its permit lives; without a permit, with
  -- its window shares (every window limit, at the cost it counts: capped at calls), for
  -- release {id} with costs. A filing is remembered for a minute and until its lapse (and
  -- after, while its ticket lives).
  INSERT INTO __SCHEMA__.requests AS q (id, params, until, outcome, at, permit, windows, ticket, retry_at,
                                        reason, lim, lapse_at)
  SELECT p_id, p_params,
         greatest(v_now + 60000,
                  CASE WHEN NOT x.g THEN (v_reply->>'lapseAt')::bigint
                       WHEN x.permit IS NOT NULL THEN
                         (SELECT pm.lapse FROM __SCHEMA__.permits pm WHERE pm.id = x.permit) END),
         CASE WHEN x.g THEN 'g' ELSE 't' END,
         CASE WHEN x.g THEN (v_reply->>'at')::bigint END,
         x.permit,
         CASE WHEN x.g AND x.permit IS NULL THEN
           (SELECT coalesce(jsonb_agg(CASE WHEN l.v ? 'refill' THEN jsonb_build_object(
                     'k', l.v->'key', 'refill', l.v->'refill', 'per', l.v->'perMs',
                     'burst', coalesce(l.v->'burst', l.v->'refill'),
                     'cost', least(coalesce((l.v->>'cost')::bigint, (req->>'cost')::bigint, 1),
                                   coalesce((l.v->>'burst')::bigint, (l.v->>'refill')::bigint)))
                   ELSE jsonb_build_object(
                     'k', l.v->'key', 'calls', l.v->'calls', 'per', l.v->'perMs',
                     'cost', least(coalesce((l.v->>'cost')::bigint, (req->>'cost')::bigint, 1),
                                   (l.v->>'calls')::bigint)) END ORDER BY l.ord), '[]'::jsonb)
              FROM jsonb_array_elements(req->'limits') WITH ORDINALITY AS l(v, ord)
             WHERE l.v ? 'calls' OR l.v ? 'refill') END,
         v_reply->>'ticket', (v_reply->>'retryAt')::bigint, v_reply->>'reason', v_reply->>'limit',
         (v_reply->>'lapseAt')::bigint
    FROM (SELECT (v_reply->>'granted')::boolean AS g, v_reply->>'permit' AS permit) x
  ON CONFLICT (id) DO UPDATE
     SET params = excluded.params, until = excluded.until, outcome = excluded.outcome, at = excluded.at,
         permit = excluded.permit, windows = excluded.windows, ticket = excluded.ticket,
         retry_at = excluded.retry_at, reason = excluded.reason, lim = excluded.lim,
         lapse_at = excluded.lapse_at;
  RETURN v_reply;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.acquire_id(jsonb, text, bigint, text, text, text, bigint) IS
  'acquire, report or peek of a request named by id (section 16): a retry is answered as the first time';

-- release {id} (section 16): undoes what the acquire named p_id (escaped) got. A grant with a
-- permit: the permit is released, settled first to costs when given (release()); a grant
-- without one: its window shares are settled to costs (RL400 naming costs[i].key for a key
-- that was not a window limit of it, and nothing changes); a filing: its ticket leaves the
-- line (costs are not read). Then the id is remembered as released for 60 s at least (an id
-- never seen too, so that its acquire arriving later changes nothing). Answers {"released":
-- true} when it changed something: a live permit released, a live ticket out of its lines (then
-- also "left": true, for the server's metrics), a window counting otherwise; else false. A
-- released id asked again is false and writes nothing.
CREATE OR REPLACE FUNCTION __SCHEMA__.undo(p_id text, costs jsonb DEFAULT NULL, at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  r record;
  e record;
  v_now bigint;
  v_live boolean;
  v_changed boolean := false;
  v_left boolean := false;
BEGIN
  PERFORM pg_advisory_xact_lock(hashtext('redb-limiter request ids __SCHEMA__'), hashtext(p_id));
  v_now := coalesce(at_ms, __SCHEMA__._clock_ms());
  SELECT * INTO r FROM __SCHEMA__.requests q WHERE q.id = p_id;
  -- Remembered until it has lived its time, and while the ticket it filed lives.
  v_live := FOUND AND r.until > v_now;
  IF FOUND AND NOT v_live AND r.outcome = 't' THEN
    v_live := EXISTS (SELECT 1 FROM __SCHEMA__.tickets t WHERE t.ticket = r.ticket AND t.lapse_at > v_now);
  END IF;
  IF v_live AND r.outcome = 'r' THEN
    RETURN jsonb_build_object('released', false);
  END IF;
  IF v_live AND r.outcome = 'g' AND r.permit IS NOT NULL THEN
    v_changed := __SCHEMA__.release(r.permit, costs, at_ms);
  ELSIF v_live AND r.outcome = 'g' AND costs IS NOT NULL THEN
    -- All or nothing: check every key before changing anything.
    FOR e IN SELECT x.key, x.ord
               FROM ROWS FROM (jsonb_to_recordset(costs) AS (key text)) WITH ORDINALITY AS x(key, ord)
              ORDER BY x.ord LOOP
      IF NOT EXISTS (SELECT 1 FROM jsonb_array_elements(r.windows) w WHERE w->>'k' = e.key) THEN
        RAISE EXCEPTION 'costs[%].key is not a window limit of the id''s grant', e.ord - 1
          USING ERRCODE = 'RL400', DETAIL = e.key;
      END IF;
    END LOOP;
    v_changed := (__SCHEMA__._settle_grant(r.at, r.windows, costs, v_now)->>'changed')::boolean;
  ELSIF v_live AND r.outcome = 't' THEN
    v_changed := __SCHEMA__.leave(r.ticket, at_ms);
    v_left := v_changed;
  END IF;
  INSERT INTO __SCHEMA__.requests AS q (id, params, until, outcome)
  VALUES (p_id, CASE WHEN v_live THEN r.params ELSE '' END,
          greatest(v_now + 60000, CASE WHEN v_live THEN r.until END), 'r')
  ON CONFLICT (id) DO UPDATE
     SET params = excluded.params, until = excluded.until, outcome = 'r', at = NULL, permit = NULL,
         windows = NULL, ticket = NULL, retry_at = NULL, reason = NULL, lim = NULL, lapse_at = NULL;
  RETURN jsonb_build_object('released', v_changed) || CASE WHEN v_left THEN '{"left": true}'::jsonb
                                                          ELSE '{}'::jsonb END;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.undo(text, jsonb, bigint) IS
  'release {id} (section 16): undo what the acquire named by id got, and remember it released';


---------------------------------------------------------------------------------------------
-- throttle: only extends; returns the until in force afterwards, or NULL.
CREATE OR REPLACE FUNCTION __SCHEMA__.throttle(key text, until_ms bigint, at_ms bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_until bigint;
BEGIN
  SELECT t.until INTO v_until FROM __SCHEMA__.throttles t WHERE t.key = throttle.key;
  IF v_until <= v_now THEN
    v_until := NULL;
  END IF;
  IF until_ms <= v_now OR v_until >= until_ms THEN
    RETURN v_until;  -- a past instant, or no later than the one in force: nothing changes
  END IF;
  INSERT INTO __SCHEMA__.throttles AS t (key, until) VALUES (throttle.key, until_ms)
  ON CONFLICT ON CONSTRAINT throttles_pkey
  DO UPDATE SET until = CASE WHEN t.until <= v_now THEN excluded.until
                             ELSE greatest(t.until, excluded.until) END
  RETURNING t.until INTO v_until;
  RETURN v_until;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.throttle(text, bigint, bigint) IS
  'throttle a caller key (section 5): only extends; returns the until in force';

-- throttle carrying a permit (section 14): the throttle as throttle(), and the permit's
-- outcome counted as limited. {"until": the until in force, "cuts", "growths"}.
CREATE OR REPLACE FUNCTION __SCHEMA__.throttle_permit(key text, until_ms bigint, permit text,
                                                      at_ms bigint DEFAULT NULL)
RETURNS jsonb
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_signal jsonb := __SCHEMA__._signal(permit, 'limited', at_ms);
BEGIN
  RETURN v_signal || jsonb_build_object('until', __SCHEMA__.throttle(key, until_ms, at_ms));
END
$$;
COMMENT ON FUNCTION __SCHEMA__.throttle_permit(text, bigint, text, bigint) IS
  'throttle a caller key (section 5), counting the permit''s outcome as limited (section 14)';

-- lift: ends a throttle in force (and wakes the caller's waits); true when there was one.
CREATE OR REPLACE FUNCTION __SCHEMA__.lift(key text, at_ms bigint DEFAULT NULL)
RETURNS boolean
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
BEGIN
  IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.throttles t WHERE t.key = lift.key AND t.until > v_now) THEN
    RETURN false;  -- nothing in force: nothing written
  END IF;
  DELETE FROM __SCHEMA__.throttles t WHERE t.key = lift.key AND t.until > v_now;
  IF NOT FOUND THEN
    RETURN false;
  END IF;
  PERFORM __SCHEMA__._wake(ARRAY[lift.key]);  -- the caller's tickets hold again, and may be ready
  RETURN true;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.lift(text, bigint) IS 'lift a throttle in force (spec 9.4)';

---------------------------------------------------------------------------------------------
-- state_rows: live buckets, permits and throttles whose keys start with prefix, in key order,
-- after `after` (exclusive), at most lim + 1 of each (one more than lim: more remain),
-- read-only, as rows (no JSON: a page of 100,000 is read as it is sent):
--   kind 'n': the instant (now_ms) the page was read at; always one row, first;
--   kind 'b': a bucket: key, window_used, calls, per_ms, concurrent, oldest (its oldest grant
--             with a cost, or NULL), held (places), next_lapse (or NULL);
--   kind 'p': a permit: key (its id), lapse, place_keys and place_lapses (the places still
--             held in buckets under prefix, in the grant's order);
--   kind 't': a throttle: key, lapse (its until);
--   kind 'l': a token bucket's level (section 13): key, window_used (its level in whole tokens),
--             calls (its burst).
-- Each kind is one statement walking its primary key in order from `after` (keyset
-- pagination): what it reads grows with the page, never with the table beyond it, a few
-- index probes per row.
DROP FUNCTION IF EXISTS __SCHEMA__.state(text, text, integer, bigint);

-- The least text greater than every text starting with p ("C" order is code point order): p
-- with its last character that is not U+10FFFF moved one code point on (over the surrogates,
-- which text cannot hold) and what follows it dropped; NULL when there is none (p empty, or
-- only U+10FFFF).
CREATE OR REPLACE FUNCTION __SCHEMA__._prefix_end(p text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS
$$
DECLARE
  v text := p;
  c integer;
BEGIN
  WHILE length(v) > 0 LOOP
    c := ascii(right(v, 1));
    v := left(v, -1);
    IF c < 1114111 THEN
      RETURN v || chr(CASE WHEN c + 1 = 55296 THEN 57344 ELSE c + 1 END);
    END IF;
  END LOOP;
  RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION __SCHEMA__.state_rows(prefix text DEFAULT '', after text DEFAULT NULL,
                                                 lim integer DEFAULT 1000, at_ms bigint DEFAULT NULL)
RETURNS TABLE (kind text, key text, now_ms bigint, window_used bigint, calls bigint, per_ms bigint,
               concurrent bigint, oldest bigint, held bigint, next_lapse bigint, lapse bigint,
               place_keys text[], place_lapses bigint[])
LANGUAGE plpgsql STABLE AS
$$
DECLARE
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_prefix text := coalesce(prefix, '');
  v_after text := coalesce(after, '');
  -- Every key under the prefix is below this, so a walk stops at the prefix's end. With no
  -- such text: 129 times U+10FFFF, above every key (at most 512 bytes, and an escaped key
  -- holds U+0001 where it grew).
  v_end text := coalesce(__SCHEMA__._prefix_end(coalesce(prefix, '')), repeat(chr(1114111), 129));
BEGIN
  RETURN QUERY SELECT 'n'::text, NULL::text, v_now, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
                      NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::text[], NULL::bigint[];

  RETURN QUERY
  SELECT 'b'::text, s.key, v_now, s.used, s.last_calls, s.retain_ms, s.last_concurrent,
         CASE WHEN s.first_cost > 0 THEN s.first_at
              WHEN s.first_at IS NOT NULL THEN
                (SELECT g.at FROM __SCHEMA__.grants g
                  WHERE g.bucket = s.id AND g.at > s.first_at AND g.cost > 0
                  ORDER BY g.at LIMIT 1) END,
         s.held, s.next, NULL::bigint, NULL::text[], NULL::bigint[]
    FROM (SELECT bk.key, bk.id, bk.last_calls, bk.retain_ms, bk.last_concurrent,
                 w.at AS first_at, w.cost AS first_cost, pl.held, pl.next,
                 CASE WHEN w.seq IS NULL THEN 0
                      WHEN bk.fen THEN bk.total + bk.dtotal - w.before - __SCHEMA__._fen_sum(bk.id, w.seq - 1)
                      ELSE bk.total - w.before END AS used
            FROM __SCHEMA__.buckets bk
            LEFT JOIN LATERAL (
                 SELECT g.at, g.seq, g.cost, g.cum - g.cost AS before FROM __SCHEMA__.grants g
                  WHERE bk.retain_ms > 0 AND g.bucket = bk.id
                    AND g.at > greatest(bk.pruned_to, v_now - bk.retain_ms)
                  ORDER BY g.at LIMIT 1) w ON true
           CROSS JOIN LATERAL (
                 SELECT count(*) AS held, min(p.lapse) AS next FROM __SCHEMA__.places p
                  WHERE p.bucket = bk.id AND p.lapse > v_now) pl
           WHERE bk.key > v_after AND bk.key >= v_prefix AND bk.key < v_end AND starts_with(bk.key, v_prefix)
           ORDER BY bk.key) s
   WHERE s.used > 0 OR s.held > 0
   ORDER BY s.key
   LIMIT lim + 1;

  -- Each bucket's line (sections 12.7 and 12.9): queued (in window_used), when its first
  -- live ticket was filed (in oldest) and that ticket (the one element of place_keys), for
  -- every bucket with a live ticket, a bucket with only a line included. The server merges
  -- these rows into the buckets' by key. The lines' buckets are walked in key order and
  -- counted from their rows (less the lapsed tickets not yet swept), so the walk stops with
  -- the page.
  RETURN QUERY
  SELECT 'q'::text, b.key, v_now, b.n, NULL::bigint, NULL::bigint, NULL::bigint, f.filed_at,
         NULL::bigint, NULL::bigint, NULL::bigint, ARRAY[f.ticket::text], NULL::bigint[]
    FROM (SELECT l.bucket AS key, __SCHEMA__._queued(l.bucket, v_now) AS n
            FROM (SELECT DISTINCT ln.bucket FROM __SCHEMA__.line ln
                   WHERE ln.bucket > v_after AND ln.bucket >= v_prefix AND ln.bucket < v_end
                     AND starts_with(ln.bucket, v_prefix)
                   ORDER BY ln.bucket) l) b
   CROSS JOIN LATERAL (
         SELECT t.filed_at, t.ticket FROM __SCHEMA__.line ln JOIN __SCHEMA__.tickets t ON t.num = ln.num
          WHERE ln.bucket = b.key AND ln.lapse_at + 0 > v_now
          ORDER BY ln.num LIMIT 1) f
   WHERE b.n > 0
   ORDER BY b.key
   LIMIT lim + 1;

  -- Each token bucket's level that lives (section 13): the level in whole tokens (in
  -- window_used; negative in debt) and its burst (in calls). The server merges these rows into
  -- the buckets' by key, as it does the lines'.
  RETURN QUERY
  SELECT 'l'::text, lv.key, v_now, __SCHEMA__._lv_tokens(ARRAY[lv.units, lv.unit_ms, lv.refill, lv.burst, lv.at], v_now),
         lv.burst, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
         NULL::text[], NULL::bigint[]
    FROM __SCHEMA__.levels lv
   WHERE lv.key > v_after AND lv.key >= v_prefix AND lv.key < v_end AND starts_with(lv.key, v_prefix)
     AND (lv.forget_at > v_now OR __SCHEMA__._lv_live(lv.key, v_now) IS NOT NULL)
   ORDER BY lv.key
   LIMIT lim + 1;

  RETURN QUERY
  SELECT 'p'::text, pm.id, v_now, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
         NULL::bigint, NULL::bigint, pm.lapse, x.keys, x.lapses
    FROM __SCHEMA__.permits pm
   CROSS JOIN LATERAL (
         SELECT coalesce(array_agg(bk.key ORDER BY y.o), '{}') AS keys,
                coalesce(array_agg(y.l ORDER BY y.o), '{}') AS lapses
           FROM unnest(pm.place_buckets, pm.place_lapses) WITH ORDINALITY AS y(b, l, o)
           JOIN __SCHEMA__.buckets bk ON bk.id = y.b
          WHERE y.l > v_now AND starts_with(bk.key, v_prefix)) x
   WHERE pm.id > v_after AND pm.lapse > v_now
     AND NOT (cardinality(x.keys) = 0 AND (v_prefix <> '' OR cardinality(pm.place_buckets) > 0))
   ORDER BY pm.id
   LIMIT lim + 1;

  RETURN QUERY
  SELECT 't'::text, th.key, v_now, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint, NULL::bigint,
         NULL::bigint, NULL::bigint, th.until, NULL::text[], NULL::bigint[]
    FROM __SCHEMA__.throttles th
   WHERE th.key > v_after AND th.key >= v_prefix AND th.key < v_end AND th.until > v_now
     AND starts_with(th.key, v_prefix)
   ORDER BY th.key
   LIMIT lim + 1;

  -- The adaptive ceilings kept (section 14): C (in window_used), max (in calls), the latest
  -- signal (in oldest), cuts (in held), the latest growth (in next_lapse) and cut (in lapse).
  RETURN QUERY
  SELECT 'c'::text, ce.key, v_now, ce.c, ce.max, NULL::bigint, NULL::bigint, ce.signal_at, ce.cuts,
         ce.grown_at, ce.cut_at, NULL::text[], NULL::bigint[]
    FROM __SCHEMA__.ceilings ce
   WHERE ce.key > v_after AND ce.key >= v_prefix AND ce.key < v_end AND starts_with(ce.key, v_prefix)
     AND (__SCHEMA__._kept_ceiling(ce.key, v_now)).key IS NOT NULL
   ORDER BY ce.key
   LIMIT lim + 1;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.state_rows(text, text, integer, bigint) IS
  'live buckets (with their lines), permits, throttles and ceilings (GET /state), paged by key, as rows, read-only';

-- Counts for metrics: rows in each table (lapsed rows not yet swept included).
CREATE OR REPLACE FUNCTION __SCHEMA__.totals() RETURNS jsonb
LANGUAGE sql STABLE AS
$$
  SELECT jsonb_build_object(
    'buckets', (SELECT count(*) FROM __SCHEMA__.buckets),
    'grants', (SELECT count(*) FROM __SCHEMA__.grants),
    'permits', (SELECT count(*) FROM __SCHEMA__.permits),
    'places', (SELECT count(*) FROM __SCHEMA__.places),
    'throttles', (SELECT count(*) FROM __SCHEMA__.throttles),
    'requests', (SELECT count(*) FROM __SCHEMA__.requests))
$$;
COMMENT ON FUNCTION __SCHEMA__.totals() IS 'row counts per table, for metrics (a full count)';

---------------------------------------------------------------------------------------------
-- sweep: deletes what no request can see any more, at most about `batch` rows of each kind
-- per call: lapsed permits with their places, passed throttles, request ids past their time,
-- grants older than their bucket's retention, Fenwick nodes no read can reach, and idle
-- buckets. Buckets are visited
-- `batch` at a time from a cursor kept in meta, so a call's work is bounded; a bucket locked
-- by a request in flight is skipped this time. Returns the number of rows deleted; call it
-- again while that is > 0. Every deletion is of state already invisible to the decisions,
-- and by margin_ms at least: a decision reads its instant and then its rows in statements
-- that follow, so what counts at that instant must still be there a moment later.
CREATE OR REPLACE FUNCTION __SCHEMA__.sweep(batch integer DEFAULT 1000, at_ms bigint DEFAULT NULL,
                                            margin_ms bigint DEFAULT 60000)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  -- everything up to this instant is past for any decision still in flight
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms()) - margin_ms;
  v_done integer := 0;
  v_k integer;
  v_cursor text;
  v_last text;
  v_prev text;
  v_end boolean := true;
  v_seen integer := 0;
  v_budget integer := batch;
  v_cut bigint;
  v_first bigint;
  b record;
  c record;
BEGIN
  -- Lapsed permits and their places.
  WITH gone AS (
    DELETE FROM __SCHEMA__.permits pm
     WHERE pm.id IN (SELECT x.id FROM __SCHEMA__.permits x WHERE x.lapse <= v_now
                      ORDER BY x.lapse LIMIT batch FOR UPDATE SKIP LOCKED)
    RETURNING pm.id, pm.place_buckets, pm.place_lapses),
  places AS (
    DELETE FROM __SCHEMA__.places pl
     USING (SELECT g.id, x.b, x.l FROM gone g, unnest(g.place_buckets, g.place_lapses) AS x(b, l)) y
     WHERE pl.bucket = y.b AND pl.lapse = y.l AND pl.permit = y.id
    RETURNING 1)
  SELECT (SELECT count(*) FROM gone) + (SELECT count(*) FROM places) INTO v_k;
  v_done := v_done + v_k;

  -- Passed throttles. (Lapsed tickets: sweep_tickets(), which counts them.)
  DELETE FROM __SCHEMA__.throttles t
   WHERE t.key IN (SELECT x.key FROM __SCHEMA__.throttles x WHERE x.until <= v_now
                    ORDER BY x.until LIMIT batch FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS v_k = ROW_COUNT;
  v_done := v_done + v_k;

  -- Request ids past their time (section 16): forgotten, but for those whose ticket still
  -- lives, which are kept until its lapse (and looked at again then).
  WITH due AS (
    SELECT x.id, x.ticket FROM __SCHEMA__.requests x WHERE x.until <= v_now
     ORDER BY x.until LIMIT batch FOR UPDATE SKIP LOCKED),
  kept AS (
    UPDATE __SCHEMA__.requests q SET until = t.lapse_at
      FROM due d JOIN __SCHEMA__.tickets t ON t.ticket = d.ticket
     WHERE q.id = d.id AND t.lapse_at > v_now
    RETURNING q.id),
  gone AS (
    DELETE FROM __SCHEMA__.requests q USING due d
     WHERE q.id = d.id AND NOT EXISTS (SELECT 1 FROM kept k WHERE k.id = d.id)
    RETURNING 1)
  SELECT count(*) INTO v_k FROM gone;
  v_done := v_done + v_k;

  -- Adaptive ceilings forgotten (section 14): their bucket gone, at their max or an hour past
  -- their latest signal.
  DELETE FROM __SCHEMA__.ceilings ce
   WHERE ce.key IN (SELECT x.key FROM __SCHEMA__.ceilings x
                     WHERE (x.c >= x.max OR x.signal_at + 3600000 <= v_now)
                       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.buckets bk WHERE bk.key = x.key)
                     LIMIT batch FOR UPDATE SKIP LOCKED);
  GET DIAGNOSTICS v_k = ROW_COUNT;
  v_done := v_done + v_k;

  -- Token levels forgotten (section 13): full for their keeping time, their bucket holding no
  -- place and no kept grant; `batch` levels visited from the cursor in meta. (A level written
  -- since is no longer due: the lock re-reads it; one locked by a request is skipped.)
  SELECT m.level_cursor INTO v_cursor FROM __SCHEMA__.meta m;
  v_last := v_cursor;
  FOR c IN SELECT lv.key, lv.forget_at FROM __SCHEMA__.levels lv
            WHERE lv.key > v_cursor ORDER BY lv.key LIMIT batch LOOP
    v_seen := v_seen + 1;
    v_last := c.key;
    CONTINUE WHEN c.forget_at > v_now OR __SCHEMA__._lv_live(c.key, v_now) IS NOT NULL;
    DELETE FROM __SCHEMA__.levels lv
     WHERE lv.key IN (SELECT x.key FROM __SCHEMA__.levels x WHERE x.key = c.key AND x.forget_at <= v_now
                         FOR UPDATE SKIP LOCKED);
    GET DIAGNOSTICS v_k = ROW_COUNT;
    v_done := v_done + v_k;
  END LOOP;
  IF v_seen < batch THEN
    v_last := '';  -- reached the last key: start from the first one next time
  END IF;
  IF v_last <> v_cursor THEN
    UPDATE __SCHEMA__.meta SET level_cursor = v_last;
  END IF;
  v_seen := 0;

  -- Buckets, from the cursor.
  SELECT m.sweep_cursor INTO v_cursor FROM __SCHEMA__.meta m;
  v_last := v_cursor;
  FOR c IN SELECT bk.key, bk.id, bk.retain_ms, bk.pruned_to, bk.queued FROM __SCHEMA__.buckets bk
            WHERE bk.key > v_cursor ORDER BY bk.key LIMIT batch LOOP
    IF v_budget <= 0 THEN
      v_end := false;
      EXIT;
    END IF;
    v_seen := v_seen + 1;
    v_prev := v_last;
    v_last := c.key;
    v_cut := greatest(c.pruned_to, v_now - c.retain_ms);
    -- Work here? Grants past retention, or an idle bucket to forget. Checked without a lock.
    IF NOT EXISTS (SELECT 1 FROM __SCHEMA__.grants g WHERE g.bucket = c.id AND g.at <= v_cut) THEN
      CONTINUE WHEN c.queued > 0
                 OR EXISTS (SELECT 1 FROM __SCHEMA__.grants g WHERE g.bucket = c.id)
                 OR EXISTS (SELECT 1 FROM __SCHEMA__.places pl
                             WHERE pl.bucket = c.id AND pl.lapse > v_now);
    END IF;
    SELECT * INTO b FROM __SCHEMA__.buckets bk WHERE bk.key = c.key FOR UPDATE SKIP LOCKED;
    CONTINUE WHEN NOT FOUND;
    v_cut := greatest(b.pruned_to, v_now - b.retain_ms);
    DELETE FROM __SCHEMA__.grants g
     WHERE g.bucket = b.id
       AND g.at = ANY (ARRAY(SELECT x.at FROM __SCHEMA__.grants x
                              WHERE x.bucket = b.id AND x.at <= v_cut
                              ORDER BY x.at LIMIT v_budget));
    GET DIAGNOSTICS v_k = ROW_COUNT;
    v_done := v_done + v_k;
    v_budget := v_budget - v_k;
    IF v_budget <= 0 THEN
      -- The budget ran out in this bucket: come back to it next time.
      v_last := v_prev;
      v_end := false;
      EXIT;
    END IF;
    SELECT min(g.seq) INTO v_first FROM __SCHEMA__.grants g WHERE g.bucket = b.id;
    IF v_first IS NULL AND b.queued = 0
       AND NOT EXISTS (SELECT 1 FROM __SCHEMA__.places pl WHERE pl.bucket = b.id AND pl.lapse > v_now) THEN
      -- Idle: no grant kept, no place held, no line (its row is the line's lock and count).
      -- Forget it (lapsed places go with their permits).
      DELETE FROM __SCHEMA__.fen f WHERE f.bucket = b.id;
      GET DIAGNOSTICS v_k = ROW_COUNT;
      DELETE FROM __SCHEMA__.buckets bk WHERE bk.id = b.id;
      v_done := v_done + v_k + 1;
      CONTINUE;
    END IF;
    IF b.fen THEN
      -- Only the nodes at or after the first kept row, and those on the path of the row just
      -- before it, can still be read.
      v_first := coalesce(v_first, b.last_seq + 1);
      DELETE FROM __SCHEMA__.fen f
       WHERE f.bucket = b.id AND f.idx < v_first
         AND f.idx <> ALL (__SCHEMA__._fen_down(v_first - 1));
      GET DIAGNOSTICS v_k = ROW_COUNT;
      v_done := v_done + v_k;
    END IF;
  END LOOP;
  IF v_end AND v_seen < batch THEN
    v_last := '';  -- reached the last key: start from the first one next time
  END IF;
  IF v_last <> v_cursor THEN
    UPDATE __SCHEMA__.meta SET sweep_cursor = v_last;
  END IF;
  RETURN v_done;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.sweep(integer, bigint, bigint) IS
  'delete lapsed permits, passed throttles, request ids past their time, forgotten ceilings and token levels, grants past retention and idle buckets, in batches';

-- Tickets lapsed by at_ms (less margin_ms) leave their lines, at most batch of them: counted
-- out of each line under its bucket row's lock, the buckets taken in key order once for the
-- whole batch (the lock order of every request), the tickets skipped while a request holds
-- them. How many lapses it counted (those not counted when presented after their lapse): the
-- sweeper calls it every second beside sweep() and counts them in /metrics, so a lapse is
-- counted about when it happens. It also records the instant as the latest a server was seen
-- at (resume_line()).
CREATE OR REPLACE FUNCTION __SCHEMA__.sweep_tickets(batch integer DEFAULT 1000, at_ms bigint DEFAULT NULL,
                                                    margin_ms bigint DEFAULT 0)
RETURNS integer
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_now bigint := coalesce(at_ms, __SCHEMA__._clock_ms());
  v_nums bigint[];
  v_counted integer;
  v_left bigint;
  v_wake text[] := '{}';
  r record;
BEGIN
  UPDATE __SCHEMA__.meta SET alive_at = v_now WHERE alive_at < v_now;
  SELECT array_agg(s.num), count(*) FILTER (WHERE NOT s.counted) INTO v_nums, v_counted
    FROM (SELECT t.num, t.counted FROM __SCHEMA__.tickets t
           WHERE t.lapse_at <= v_now - margin_ms
           ORDER BY t.lapse_at LIMIT batch FOR UPDATE SKIP LOCKED) s;
  IF v_nums IS NULL THEN
    RETURN 0;
  END IF;
  FOR r IN SELECT k.key, count(*) AS c
             FROM __SCHEMA__.tickets t CROSS JOIN LATERAL unnest(t.keys) AS k(key)
            WHERE t.num = ANY (v_nums)
            GROUP BY k.key ORDER BY k.key COLLATE "C" LOOP
    UPDATE __SCHEMA__.buckets SET queued = queued - r.c WHERE key = r.key RETURNING queued INTO v_left;
    IF v_left > 0 THEN
      v_wake := v_wake || r.key;
    END IF;
  END LOOP;
  DELETE FROM __SCHEMA__.line q USING __SCHEMA__.tickets t
   WHERE t.num = ANY (v_nums) AND q.bucket = ANY (t.keys) AND q.num = t.num;
  DELETE FROM __SCHEMA__.tickets t WHERE t.num = ANY (v_nums);
  IF cardinality(v_wake) > 0 THEN
    PERFORM __SCHEMA__._wake(v_wake);  -- the tickets behind the lapsed ones may be ready now
  END IF;
  RETURN v_counted;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.sweep_tickets(integer, bigint, bigint) IS
  'end tickets lapsed by at_ms - margin_ms, in batches; how many lapses it counted';

-- Warms a new session: a backend compiles each plpgsql function the first time it calls it and
-- plans each of its statements the first time it runs, which costs a fresh session some 200 ms
-- on its first acquire in the line and some 40 ms on its first grant (measured on a local
-- cluster). A request that paid it would pay it holding the row locks of its buckets, and every
-- other request on them would wait: a pool that opens sessions under load (after idle ones
-- were closed) stalled the line for the first seconds. The server calls this once on every
-- session it opens, before handing it out. It runs the hot paths (a peek, a grant, a filing,
-- a renewal, a wait's look, a settle and a release in the line; a plain grant; a place) on
-- keys no request can name (U+0001 U+0003 is no escaped form: see keys.rs), inside a block
-- that then raises, so that everything it wrote is rolled back and nothing is notified; the
-- plans stay with the session. It answers how long it took, in ms.
CREATE OR REPLACE FUNCTION __SCHEMA__.warm() RETURNS bigint
LANGUAGE plpgsql VOLATILE AS
$$
DECLARE
  v_start timestamptz := clock_timestamp();
  -- one key per backend: sessions warming at once never wait for each other's row locks
  v_key text := chr(1) || chr(3) || 'warm ' || pg_backend_pid();
  v_req jsonb;
  v_g jsonb;
  v_r jsonb;
BEGIN
  BEGIN
    v_req := jsonb_build_object('key', v_key, 'queue', true, 'permit', true,
                                'limits', jsonb_build_array(jsonb_build_object('key', v_key, 'calls', 1, 'perMs', 1000)));
    PERFORM __SCHEMA__.acquire(v_req, 'peek', 250, '', NULL);
    v_g := __SCHEMA__.acquire(v_req, 'acquire', 250, 'p-warm-1', NULL);
    v_r := __SCHEMA__.acquire(v_req, 'acquire', 250, 'p-warm-2', NULL);
    IF v_r ? 'ticket' THEN
      PERFORM __SCHEMA__.acquire(v_req || jsonb_build_object('ticket', v_r->>'ticket'), 'acquire', 250, 'p-warm-3', NULL);
      PERFORM __SCHEMA__.wait_check(ARRAY[v_r->>'ticket'], NULL, 250, NULL);
    END IF;
    IF v_g ? 'permit' THEN
      PERFORM __SCHEMA__.settle(v_g->>'permit', jsonb_build_array(jsonb_build_object('key', v_key, 'cost', 1)), NULL);
      PERFORM __SCHEMA__.release(v_g->>'permit', NULL, NULL);
    END IF;
    PERFORM __SCHEMA__.acquire(jsonb_build_object('key', v_key, 'limits', jsonb_build_array(
      jsonb_build_object('key', v_key || 'w', 'calls', 1, 'perMs', 1000))), 'acquire', 250, '', NULL);
    PERFORM __SCHEMA__.acquire(jsonb_build_object('key', v_key, 'limits', jsonb_build_array(
      jsonb_build_object('key', v_key || 'c', 'concurrent', 1))), 'acquire', 250, 'p-warm-4', NULL);
    RAISE EXCEPTION 'warm' USING ERRCODE = 'RLW01';
  EXCEPTION WHEN SQLSTATE 'RLW01' THEN
    NULL;  -- rolled back: nothing of it stays but the session's plans
  END;
  RETURN (extract(epoch FROM clock_timestamp() - v_start) * 1000)::bigint;
END
$$;
COMMENT ON FUNCTION __SCHEMA__.warm() IS
  'compiles and plans the hot paths in a new session (all of it rolled back); its duration in ms';

-- The format version this schema carries.
CREATE OR REPLACE FUNCTION __SCHEMA__.version() RETURNS integer
LANGUAGE sql STABLE AS
$$ SELECT version FROM __SCHEMA__.meta $$;
COMMENT ON FUNCTION __SCHEMA__.version() IS 'the redb-limiter format version of this schema';

COMMIT;
