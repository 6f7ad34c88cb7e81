-- Migration 0007: scraping scheduling (issue 9, SCR-7…SCR-9): domain limits, fairness, priorities.
-- Function bodies are kept byte for byte as this revision first ran them, indentation
-- included: PostgreSQL stores a body as written, and schema.sql compares them.

ALTER TABLE scraping.jobs ADD COLUMN domain text;

-- python: backfill_domains
-- Jobs accepted before this revision get the host of their URL, lowercased and
-- IDNA-encoded: Python's idna package does that (0007_scraping_scheduling.py), this
-- revision's SQL has no IDNA encoder.

ALTER TABLE scraping.jobs ALTER COLUMN domain SET NOT NULL;

-- The pick: a tenant's due head in one class (the domain read from the index) ...
CREATE INDEX ix_jobs_pick ON scraping.jobs (priority, tenant_id, next_attempt_at, id)
    INCLUDE (domain) WHERE status = 'queued';

-- ... a tenant's distinct domains in one class, each domain's oldest due ...
CREATE INDEX ix_jobs_pick_domain ON scraping.jobs
    (priority, tenant_id, domain, next_attempt_at, id) WHERE status = 'queued';

-- ... and the connections a domain has open. The sensor walks queued domains.
CREATE INDEX ix_jobs_running_domain ON scraping.jobs (domain)
    WHERE status = 'running';

CREATE INDEX ix_jobs_queued_domain ON scraping.jobs (domain, next_attempt_at)
    WHERE status = 'queued';

ALTER TABLE scraping.tenants ADD COLUMN weight double precision NOT NULL DEFAULT 1
    CONSTRAINT tenants_weight_check CHECK (weight > 0 AND weight <= 1000);

CREATE TABLE scraping.domains (
    domain text PRIMARY KEY,
    -- Overrides of PIN_SCRAPING_DOMAIN_RPS / _CONCURRENCY; NULL = the default.
    rps double precision
        CONSTRAINT domains_rps_check CHECK (rps >= 0.01 AND rps <= 10000),
    concurrency integer CONSTRAINT domains_concurrency_check
        CHECK (concurrency > 0 AND concurrency <= 10000),
    -- Token bucket: `tokens` as of `tokens_at` (NULL: full).
    tokens double precision,
    tokens_at timestamptz,
    -- No request to this domain before then (its 429 / Retry-After).
    blocked_until timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The claim loads the domains that are not simply untouched: paused, bucket spent
-- within the last 100 s, overridden (and those with running jobs).
CREATE INDEX ix_domains_blocked ON scraping.domains (blocked_until)
    WHERE blocked_until IS NOT NULL;

CREATE INDEX ix_domains_tokens_at ON scraping.domains (tokens_at);

CREATE INDEX ix_domains_overrides ON scraping.domains (domain)
    WHERE rps IS NOT NULL OR concurrency IS NOT NULL;

CREATE TABLE scraping.pick_classes (
    priority text PRIMARY KEY CHECK (priority IN ('high', 'normal', 'low')),
    share integer NOT NULL CHECK (share > 0 AND 60 % share = 0),
    -- Finish tag of the class's last pick, start tag of it (the class clock is the
    -- largest last_start), and the clock of the tenants inside the class.
    vtime bigint NOT NULL DEFAULT 0,
    last_start bigint NOT NULL DEFAULT 0,
    tenant_clock double precision NOT NULL DEFAULT 0
);

INSERT INTO scraping.pick_classes (priority, share)
VALUES ('high', 6), ('normal', 3), ('low', 1);

CREATE TABLE scraping.tenant_vtimes (
    priority text NOT NULL REFERENCES scraping.pick_classes (priority),
    tenant_id uuid NOT NULL REFERENCES scraping.tenants (id) ON DELETE CASCADE,
    vtime double precision NOT NULL,
    PRIMARY KEY (priority, tenant_id)
);

-- The claim. Serialised by one transaction-level advisory lock (see the plan below).
CREATE FUNCTION scraping.claim_jobs(
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS SETOF scraping.jobs
LANGUAGE plpgsql VOLATILE AS $fn$
-- Claim up to p_limit due jobs for worker p_worker: each gets a lease, its attempt counter
-- and an attempt row. Every pick goes priority -> tenant -> domain with room -> oldest due:
--
-- 1. Priority class: start-time fair queuing over the classes with shares 6:3:1. A class's
--    start tag is max(its finish tag, the class clock); the smallest start tag wins (ties:
--    the higher class), then its finish tag grows by 60/share (10, 20, 60). With all three
--    backlogged every window of ten picks is exactly 6 high, 3 normal, 1 low; a class with
--    nothing claimable is passed over (its share goes to the others in proportion) and,
--    when it comes back, starts at the clock: it cannot hoard credit, and low always moves.
-- 2. Tenant, inside the class: the same scheme over tenants, step 1/weight per job started
--    (pick_classes.tenant_clock is the class's tenant clock). A tenant idle for a while
--    comes back at the clock, i.e. first in line: served at the next pick of its class.
-- 3. Job of that tenant: its oldest due jobs in (next_attempt_at, id) order, skipping those
--    whose domain has no room; at most 256 looked at. When all 256 sit on domains without
--    room (a crawler's backlog on one busy site), the tenant's distinct domains are walked
--    instead (a skip scan) and the first domain with room gives its oldest due job. A
--    tenant with nothing claimable is passed over for the rest of this call.
-- A domain has room while no 429/Retry-After pause holds (blocked_until), its running jobs
-- (counted from the jobs themselves, so nothing can drift) are below its concurrency, and
-- its token bucket holds a token: max(1, rps) tokens (one second's burst), refilled at
-- rps; a domain without a row has a full bucket.
--
-- Plan (EXPLAIN ANALYZE at 1M queued jobs: bench/scraping_pick.py, bench/README.md):
-- - the scheduler's state is read once per call into local arrays and written back once
--   at the end; a pick itself touches no state table. Domains: one query over the running
--   jobs (ix_jobs_running_domain, a few hundred rows) and the domains rows that are paused,
--   spent within 100 s or overridden (ix_domains_blocked, ix_domains_tokens_at,
--   ix_domains_overrides); every other domain is untouched (full bucket, no connection);
-- - active tenants of a class: a recursive skip scan over ix_jobs_pick_domain (priority,
--   tenant_id, ...) WHERE status = 'queued', one index probe per tenant, once per call;
-- - a tenant's due head: an index-only range scan of ix_jobs_pick (priority, tenant_id,
--   next_attempt_at, id) INCLUDE (domain), LIMIT 256, domains without room filtered out
--   in the same statement (a jsonb key lookup);
-- - the deep walk: a skip scan over ix_jobs_pick_domain, then the domain's oldest due;
-- - the chosen job is locked with FOR UPDATE SKIP LOCKED (a cancel or a sweep holding it
--   is skipped, never waited for); at the end one UPDATE by primary key claims the batch
--   and one INSERT writes its attempt rows.
-- So a pick costs a few index probes whatever the depth of the queue; nothing scans it.
--
-- Concurrent workers: the whole claim holds one transaction-level advisory lock, so two
-- claims never both see a domain's last free connection or token, and the clocks advance
-- one pick at a time. A claim takes milliseconds and a worker claims once per round for
-- all its free slots, so the lock is held a small fraction of the time. Domain rows are
-- written at the end in name order (finish_attempts writes its pauses in the same order),
-- so a claim and an outcome write never deadlock.
DECLARE
    t0 timestamptz;
    picked uuid[] := '{}';
    -- classes: high, normal, low
    c_name text[] := ARRAY['high', 'normal', 'low'];
    c_step bigint[];
    c_finish bigint[];
    c_start bigint[];
    c_tclock double precision[];
    c_done boolean[] := ARRAY[false, false, false];
    c_loaded boolean[] := ARRAY[false, false, false];
    v_clock bigint;
    ci integer;
    -- tenants of the loaded classes, one entry per (class, tenant): class ci's tenants are
    -- entries c_lo[ci]..c_hi[ci], in tenant id order; t_sel is the finish tag the pick
    -- compares, Infinity once the tenant is passed over for this call
    c_lo integer[] := ARRAY[0, 0, 0];
    c_hi integer[] := ARRAY[-1, -1, -1];
    t_class integer[] := '{}';
    t_id uuid[] := '{}';
    t_finish double precision[] := '{}';
    t_sel double precision[] := '{}';
    t_weight double precision[] := '{}';
    t_deep boolean[] := '{}';
    t_picked boolean[] := '{}';
    ti integer;
    v_start double precision;
    -- domains looked at in this call: tokens at t0, free connections, spent here
    d_name text[] := '{}';
    d_tokens double precision[] := '{}';
    d_free integer[] := '{}';
    d_used integer[] := '{}';
    di integer;
    v_job uuid;
    v_dom text;
    v_deep boolean;
    -- domains without room: every one constrained at t0 (loaded once), then the ones
    -- this call fills; a jsonb object as a set (key lookups are a binary search)
    v_full jsonb;
    r record;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock(7274720907);
    -- One clock for the whole claim, read after the lock: token refills are measured
    -- between claims that really ran one after the other.
    t0 := clock_timestamp();

    -- Every domain that is not simply untouched (a full bucket, no connection open, the
    -- default limits): running jobs, a pause, a bucket spent within the last 100 s (rps
    -- >= 0.01: an empty bucket has a token again by then), an override.
    WITH busy AS (
        SELECT j.domain, count(*) AS n FROM scraping.jobs j
        WHERE j.status = 'running' GROUP BY j.domain
    ), touched AS (
        SELECT busy.domain FROM busy
        UNION SELECT d.domain FROM scraping.domains d WHERE d.blocked_until > t0
        UNION SELECT d.domain FROM scraping.domains d
              WHERE d.tokens_at > t0 - interval '100 seconds'
        UNION SELECT d.domain FROM scraping.domains d
              WHERE d.rps IS NOT NULL OR d.concurrency IS NOT NULL
    ), room AS (
        SELECT t.domain,
               CASE
                   WHEN d.blocked_until > t0 THEN 0
                   WHEN d.tokens IS NULL THEN greatest(1.0, coalesce(d.rps, p_default_rps))
                   ELSE least(greatest(1.0, coalesce(d.rps, p_default_rps)),
                              d.tokens + coalesce(d.rps, p_default_rps) * greatest(
                                  0.0, extract(epoch FROM t0 - d.tokens_at)))
               END AS tokens,
               (coalesce(d.concurrency, p_default_concurrency) - coalesce(busy.n, 0))::integer
                   AS free
        FROM touched t
        LEFT JOIN scraping.domains d ON d.domain = t.domain
        LEFT JOIN busy ON busy.domain = t.domain
    )
    SELECT coalesce(array_agg(domain), '{}'), coalesce(array_agg(tokens), '{}'),
           coalesce(array_agg(free), '{}'), coalesce(array_agg(0), '{}'),
           coalesce(jsonb_object_agg(domain, true) FILTER (WHERE tokens < 1 OR free < 1),
                    '{}')
    INTO d_name, d_tokens, d_free, d_used, v_full
    FROM room;

    -- Nothing to claim when every domain with queued jobs is without room (all paused, or
    -- all at their limits): found by walking the queued domains (a skip scan over
    -- ix_jobs_queued_domain) up to the first one with room, instead of walking every
    -- tenant's domains below.
    IF v_full <> '{}' THEN
        PERFORM 1 FROM (
            WITH RECURSIVE queued(name) AS (
                (SELECT j.domain FROM scraping.jobs j WHERE j.status = 'queued'
                 ORDER BY j.domain LIMIT 1)
                UNION ALL
                SELECT (SELECT j.domain FROM scraping.jobs j
                        WHERE j.status = 'queued' AND j.domain > q.name
                        ORDER BY j.domain LIMIT 1)
                FROM queued q WHERE q.name IS NOT NULL
            )
            SELECT 1 FROM queued WHERE queued.name IS NOT NULL AND NOT (v_full ? queued.name)
            LIMIT 1
        ) one_with_room;
        IF NOT FOUND THEN
            RETURN;
        END IF;
    END IF;

    SELECT array_agg(60 / share ORDER BY array_position(c_name, priority)),
           array_agg(vtime ORDER BY array_position(c_name, priority)),
           array_agg(last_start ORDER BY array_position(c_name, priority)),
           array_agg(tenant_clock ORDER BY array_position(c_name, priority)),
           max(last_start)
    INTO c_step, c_finish, c_start, c_tclock, v_clock
    FROM scraping.pick_classes;

    <<picks>>
    WHILE coalesce(array_length(picked, 1), 0) < p_limit LOOP
        -- 1. the class with the smallest start tag (ties: the higher class)
        ci := NULL;
        FOR k IN 1..3 LOOP
            CONTINUE WHEN c_done[k];
            IF ci IS NULL OR greatest(c_finish[k], v_clock) < greatest(c_finish[ci], v_clock)
            THEN
                ci := k;
            END IF;
        END LOOP;
        EXIT picks WHEN ci IS NULL;

        IF NOT c_loaded[ci] THEN
            c_loaded[ci] := true;
            c_lo[ci] := coalesce(array_length(t_id, 1), 0) + 1;
            FOR r IN
                WITH RECURSIVE active(tid) AS (
                    (SELECT j.tenant_id FROM scraping.jobs j
                     WHERE j.status = 'queued' AND j.priority = c_name[ci]
                     ORDER BY j.tenant_id LIMIT 1)
                    UNION ALL
                    SELECT (SELECT j.tenant_id FROM scraping.jobs j
                            WHERE j.status = 'queued' AND j.priority = c_name[ci]
                              AND j.tenant_id > a.tid
                            ORDER BY j.tenant_id LIMIT 1)
                    FROM active a WHERE a.tid IS NOT NULL
                )
                SELECT a.tid, coalesce(v.vtime, 0) AS vtime, tn.weight
                FROM active a
                JOIN scraping.tenants tn ON tn.id = a.tid
                LEFT JOIN scraping.tenant_vtimes v
                       ON v.priority = c_name[ci] AND v.tenant_id = a.tid
                WHERE a.tid IS NOT NULL
                ORDER BY a.tid
            LOOP
                t_class := t_class || ci;
                t_id := t_id || r.tid;
                t_finish := t_finish || r.vtime;
                t_sel := t_sel || r.vtime;
                t_weight := t_weight || r.weight;
                t_deep := t_deep || false;
                t_picked := t_picked || false;
            END LOOP;
            c_hi[ci] := coalesce(array_length(t_id, 1), 0);
        END IF;

        -- 2. the class's tenant with the smallest start tag (ties: tenant id), then
        -- 3. that tenant's oldest due job on a domain with room
        v_job := NULL;
        WHILE v_job IS NULL LOOP
            SELECT c_lo[ci] - 1 + u.o INTO ti
            FROM unnest(t_sel[c_lo[ci]:c_hi[ci]]) WITH ORDINALITY AS u(f, o)
            WHERE u.f < 'Infinity'
            ORDER BY greatest(u.f, c_tclock[ci]), u.o
            LIMIT 1;
            IF NOT FOUND THEN
                c_done[ci] := true;
                CONTINUE picks;
            END IF;

            IF NOT t_deep[ti] THEN
                FOR r IN
                    SELECT h.id, h.domain FROM (
                        SELECT j.id, j.domain, j.next_attempt_at FROM scraping.jobs j
                        WHERE j.status = 'queued' AND j.priority = c_name[ci]
                          AND j.tenant_id = t_id[ti] AND j.next_attempt_at <= t0
                        ORDER BY j.next_attempt_at, j.id
                        LIMIT 256
                    ) h
                    WHERE NOT (v_full ? h.domain) AND h.id <> ALL (picked)
                    ORDER BY h.next_attempt_at, h.id
                LOOP
                    v_dom := r.domain;
                    di := array_position(d_name, v_dom);
                    IF di IS NULL THEN  -- untouched: a full bucket, no connection open
                        d_name := d_name || v_dom;
                        d_tokens := d_tokens || greatest(1.0, p_default_rps);
                        d_free := d_free || p_default_concurrency;
                        d_used := d_used || 0;
                        di := array_length(d_name, 1);
                    END IF;
                    IF d_tokens[di] - d_used[di] < 1 OR d_free[di] - d_used[di] < 1 THEN
                        v_full := v_full || jsonb_build_object(v_dom, true);
                        CONTINUE;
                    END IF;
                    PERFORM 1 FROM scraping.jobs j
                    WHERE j.id = r.id AND j.status = 'queued'
                    FOR UPDATE SKIP LOCKED;
                    IF FOUND THEN
                        v_job := r.id;
                        EXIT;
                    END IF;
                END LOOP;
                IF v_job IS NULL THEN
                    -- All of the head on full domains: walk the domains, unless the head
                    -- was all there is.
                    SELECT count(*) = 256 INTO v_deep FROM (
                        SELECT 1 FROM scraping.jobs j
                        WHERE j.status = 'queued' AND j.priority = c_name[ci]
                          AND j.tenant_id = t_id[ti] AND j.next_attempt_at <= t0
                        LIMIT 256) h;
                    t_deep[ti] := v_deep;
                END IF;
            END IF;

            IF v_job IS NULL AND t_deep[ti] THEN
                v_dom := '';
                LOOP
                    SELECT j.domain INTO v_dom FROM scraping.jobs j
                    WHERE j.status = 'queued' AND j.priority = c_name[ci]
                      AND j.tenant_id = t_id[ti] AND j.domain > v_dom
                    ORDER BY j.domain
                    LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    CONTINUE WHEN v_full ? v_dom;
                    di := array_position(d_name, v_dom);
                    IF di IS NULL THEN  -- untouched: a full bucket, no connection open
                        d_name := d_name || v_dom;
                        d_tokens := d_tokens || greatest(1.0, p_default_rps);
                        d_free := d_free || p_default_concurrency;
                        d_used := d_used || 0;
                        di := array_length(d_name, 1);
                    END IF;
                    IF d_tokens[di] - d_used[di] < 1 OR d_free[di] - d_used[di] < 1 THEN
                        v_full := v_full || jsonb_build_object(v_dom, true);
                        CONTINUE;
                    END IF;
                    SELECT j.id INTO v_job FROM scraping.jobs j
                    WHERE j.status = 'queued' AND j.priority = c_name[ci]
                      AND j.tenant_id = t_id[ti] AND j.domain = v_dom
                      AND j.next_attempt_at <= t0 AND j.id <> ALL (picked)
                    ORDER BY j.next_attempt_at, j.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED;
                    EXIT WHEN FOUND;
                END LOOP;
            END IF;

            IF v_job IS NULL THEN
                t_sel[ti] := 'Infinity';
            END IF;
        END LOOP;

        -- The pick: spend the domain's token and connection, advance both clocks.
        picked := picked || v_job;
        d_used[di] := d_used[di] + 1;
        v_start := greatest(t_finish[ti], c_tclock[ci]);
        c_tclock[ci] := v_start;
        t_finish[ti] := v_start + 1.0 / t_weight[ti];
        t_sel[ti] := t_finish[ti];
        t_picked[ti] := true;
        v_clock := greatest(c_finish[ci], v_clock);
        c_start[ci] := v_clock;
        c_finish[ci] := v_clock + c_step[ci];
    END LOOP;

    IF coalesce(array_length(picked, 1), 0) = 0 THEN
        RETURN;
    END IF;

    UPDATE scraping.pick_classes c
    SET vtime = c_finish[ck], last_start = c_start[ck], tenant_clock = c_tclock[ck]
    FROM generate_subscripts(c_name, 1) AS ck
    WHERE c.priority = c_name[ck];
    INSERT INTO scraping.tenant_vtimes AS tv (priority, tenant_id, vtime)
    SELECT c_name[u.c], u.id, u.f
    FROM unnest(t_class, t_id, t_finish, t_picked) AS u(c, id, f, was_picked)
    WHERE u.was_picked
    ON CONFLICT (priority, tenant_id) DO UPDATE SET vtime = EXCLUDED.vtime;

    -- Spend the tokens: each domain picked from keeps what it had at t0 minus its picks.
    INSERT INTO scraping.domains AS d (domain, tokens, tokens_at)
    SELECT u.name, u.tokens - u.used, t0
    FROM unnest(d_name, d_tokens, d_used) AS u(name, tokens, used)
    WHERE u.used > 0
    ORDER BY u.name
    ON CONFLICT (domain) DO UPDATE SET tokens = EXCLUDED.tokens, tokens_at = EXCLUDED.tokens_at;

    RETURN QUERY
    WITH claimed AS (
        UPDATE scraping.jobs j
        SET status = 'running',
            attempts = j.attempts + 1,
            lease_owner = p_worker,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            started_at = coalesce(j.started_at, now()),
            updated_at = now()
        WHERE j.id = ANY (picked)
        RETURNING j.*
    ), attempt AS (
        INSERT INTO scraping.job_attempts (job_id, number, worker)
        SELECT c.id, c.attempts, p_worker FROM claimed c
    )
    SELECT c.* FROM claimed c
    JOIN unnest(picked) WITH ORDINALITY AS p(id, o) ON p.id = c.id
    ORDER BY p.o;
END
$fn$;
