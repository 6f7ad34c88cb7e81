-- scraping.claim_jobs: the pick (README "Scheduling", docs/jobs/scraping.md).
--
-- Claim up to p_limit due jobs for worker p_worker: each gets a lease (from
-- clock_timestamp(), the moment it is claimed), its attempt counter and an attempt row.
-- Every pick goes priority class -> the tenant whose turn it is -> one of that tenant's
-- flows (its jobs on one domain) whose domain has room -> that flow's due job with the
-- smallest fair tag.
--
-- 1. Class: start-time fair queuing over the classes with shares 6:3:1, state in
--    scraping.pick_classes: with all three backlogged every window of ten picks is
--    exactly 6 high, 3 normal, 1 low; a class with nothing claimable is passed over and,
--    when it comes back, starts at the clock (no banked credit).
-- 2. Tenant: start-time fair queuing by jobs started. scraping.tenant_queues holds one row
--    per (class, tenant) with queued jobs: its start tag and whether it is parked. The
--    pick takes the unparked tenant with the smallest start tag (ix_tenant_queues_pick)
--    and, when it starts one of its jobs, advances its tag by 1/weight; the class clock
--    (scraping.class_clocks.start_clock) is the largest tag picked, by any claim (each
--    claim raises it in a clock slot of its own, below). A tenant none of whose flows can
--    be claimed (every one on a domain without room, or not due) is parked: it leaves the
--    pick, and its tag stands still, so jobs waiting on a paused or full domain neither
--    cost nor bank a turn. It comes back when one of its flows wakes (here, at the next
--    claim) or when a job of it can be claimed at intake, at the class clock or its own
--    tag, whichever is later. Bound: two tenants of weights w_a and w_b with claimable
--    work all through a run of picks by one claim start n_a and n_b jobs with
--    |n_a/w_a - n_b/w_b| <= 1/w_a + 1/w_b, from start tags level as claims one after the
--    other leave them (claims at once may leave a tenant one of them held behind: the
--    next claims serve it until it is level, docs/jobs/scraping.md). Start tags and the
--    start clock are numeric (migration 0046), the step 1/weight rounded to 20 decimals:
--    added exactly at any size, so the bound holds however long the history (in a double
--    a step of 0.001 was lost from 2**44, and one tenant took every pick). The jobs' fair
--    tags, the tag clock and the flows' heads stay double precision: they order one
--    tenant's own jobs, never whose turn it is.
-- 3. Flow: scraping.tenant_flows holds one row per (domain, class, tenant) with queued
--    jobs, its head (the smallest fair tag: a tenant's flows are taken oldest first) and
--    whether it may be claimed (`ready`). A flow without a due job is set aside until its
--    first job is due. A flow whose domain has no room (paused, bucket empty, connections
--    full) is set aside with every other ready flow of its domain and class, in one
--    statement (set_domain_flows_aside, up to 1000), and their tenants left with nothing
--    to claim are parked with them: until the pause ends; one token apart from the next
--    token on (so they come back one per token, not all at once); or until a finishing
--    job wakes the first four waiting for a connection (wake_room_flows), a minute at
--    most. A pause sets its domain's flows aside, and parks their tenants, when it starts
--    (trigger domains_domain_queue), so a paused domain costs a claim nothing.
--
-- Bounded work per claim: flows woken at its start (1000 at most), and set-asides during
-- it (MAX_SET_ASIDE: a flow set aside alone or a tenant parked counts one, a domain's
-- flows set aside together one per 16 of them; past that the claim ends with what it has).
-- What it set aside stays aside for the next claims, so a domain without room shared by
-- 20,000 tenants costs them one set-aside each per wait, spread over a few claims, not
-- 20,000 rows a claim.
--
-- Concurrency: no global lock. A claim locks the tenant row it picks from (FOR NO KEY
-- UPDATE SKIP LOCKED: another claim takes the next tenant; a tenant's claims run one after
-- the other), the flow, and the domain's state row (scraping.domains: token bucket, pause)
-- with FOR UPDATE SKIP LOCKED, so two claimers never both spend a domain's last token or
-- connection (connections are counted from the jobs themselves under that row lock). It
-- waits for a lock only when every tenant of a class with claimable work is being claimed
-- from (few tenants, many claimers): for the first of them, in a subtransaction, at most
-- half a second (a tenant's row is held by intake too, until it commits: a producer's own
-- transaction, open as long as it likes, must not stop the claim); a wait ended by the
-- deadlock detector or that limit only ends the class's picks in this call. The connection count is taken in the probe's
-- snapshot, i.e. before the row lock: it is used only when the domain row locked is the
-- version that snapshot sees (ctid equal); every claim that makes a domain's jobs running
-- writes that domain's row before it commits (its token spend), so a claim that
-- committed after the snapshot left a newer row version, and the count is taken again.
--
-- A domain picked from is kept in the call's local state (its bucket, its connections,
-- its lock): picked again in this call it costs no more lookups. Its token spends, the
-- tenants' start tags and the flows' heads are written once, at the end (set-based; the
-- rows stay locked by this transaction until it ends). At the end one UPDATE claims the
-- batch (each job's lease stamped with its pick's clock_timestamp()) and one INSERT
-- writes its attempt rows. Then the class state, last, so its rows are held only for the
-- commit: the class sequence (pick_classes: vtime, last_start) all three rows or, when
-- another claim holds them, not at all (both continued it from the same point); the class
-- clocks (start_clock, tenant_clock; a slot's start clock is its exact_start_clock), which
-- only grow, as greatest() into one of eight
-- slots (scraping.pick_class_clocks), the first no other claim holds, so a claim never
-- waits for them (unless all eight are held) and never leaves them behind; every reader
-- takes the largest over the slots (view scraping.class_clocks). Nothing per pick grows
-- with tenants, domains, paused domains or queue depth.
-- A domain's token bucket at p_now: one second's worth (at least 1) when full, refilled at
-- p_rps since it was last spent. Also what a redirect hop spends (redirect_slots.sql).
CREATE OR REPLACE FUNCTION scraping.domain_tokens(
    p_domain scraping.domains, p_rps double precision, p_now timestamptz
) RETURNS double precision
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT CASE
        WHEN p_domain.tokens IS NULL THEN greatest(1.0, p_rps)
        ELSE least(greatest(1.0, p_rps),
                   p_domain.tokens + p_rps * greatest(
                       0.0, extract(epoch FROM p_now - p_domain.tokens_at)))
    END
$fn$;

-- A (domain, class) queue whose last flow the claim deleted goes too, unless a writer
-- holds it (intake announcing jobs to it holds it KEY SHARE until it commits: then it
-- stays, and the jobs with it).
CREATE OR REPLACE FUNCTION scraping.drop_empty_domain_queue(p_domain text, p_priority text)
RETURNS void
LANGUAGE sql AS $fn$
    DELETE FROM scraping.domain_queues q
    WHERE q.ctid = (
        SELECT q2.ctid FROM scraping.domain_queues q2
        WHERE q2.domain = p_domain AND q2.priority = p_priority
          AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                          WHERE f.domain = p_domain AND f.priority = p_priority)
        FOR UPDATE SKIP LOCKED);
$fn$;

-- A domain's ready flows of a class set aside for room (the claim holds the domain's row):
-- p_first's, then up to 1000 others (rows other transactions hold left as they are); the
-- k-th (from 0) until p_until + k * p_apart seconds. Returns their tenants.
CREATE OR REPLACE FUNCTION scraping.set_domain_flows_aside(
    p_domain text, p_priority text, p_first uuid, p_until timestamptz,
    p_apart double precision
) RETURNS TABLE (tenant_id uuid)
LANGUAGE sql AS $fn$
    WITH locked AS (
        SELECT f.ctid AS row_id, f.tenant_id
        FROM scraping.tenant_flows f
        WHERE f.domain = p_domain AND f.priority = p_priority AND f.ready
          AND f.tenant_id <> p_first
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
    ), ranked AS (
        SELECT f.ctid AS row_id, 0 AS k
        FROM scraping.tenant_flows f
        WHERE f.domain = p_domain AND f.priority = p_priority AND f.tenant_id = p_first
        UNION ALL
        SELECT l.row_id, row_number() OVER (ORDER BY l.tenant_id) AS k
        FROM locked l
    )
    UPDATE scraping.tenant_flows f
    SET ready = false, waiting_for = 'room',
        wake_at = p_until + make_interval(secs => r.k * p_apart)
    FROM ranked r
    WHERE f.ctid = r.row_id
    RETURNING f.tenant_id;
$fn$;

CREATE OR REPLACE FUNCTION scraping.claim_jobs(
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS SETOF scraping.jobs
LANGUAGE plpgsql VOLATILE
-- Every statement here is an index probe whose plan does not depend on its values; left to
-- choose, PL/pgSQL planned them afresh at every pick.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    -- flows set aside and tenants parked in one call, at most
    MAX_SET_ASIDE CONSTANT integer := 1024;
    c_name text[] := ARRAY['high', 'normal', 'low'];
    c_step bigint[];
    c_finish bigint[];
    c_start bigint[];
    -- the class clocks: the job-tag clock (double precision, as the jobs' fair tags) and
    -- the start clock (numeric, as the tenants' start tags: exact, see v_step)
    c_tclock double precision[];
    c_sclock numeric[];
    -- the class clocks as read at the start (written back only when a pick moved one)
    c_tclock0 double precision[];
    c_sclock0 numeric[];
    c_done boolean[] := ARRAY[false, false, false];
    v_clock bigint;
    ci integer;
    n_picked integer := 0;
    n_set_aside integer := 0;
    v_now timestamptz;
    v_tenant uuid;
    v_tenant_tag numeric;
    -- A start of the tenant picked advances its start tag by 1/weight, in numeric rounded
    -- to 20 decimals: a tag is a sum of such steps and of clocks that are themselves such
    -- sums (or doubles 0046 carried exactly), so its scale stays bounded and no step is
    -- ever lost, however large the tags (in double precision 0.001 was lost from 2**44
    -- and 1 from 2**53, and one tenant took every pick).
    v_step numeric;
    v_probe record;
    v_fdomain text;
    v_domain scraping.domains;
    v_rps double precision;
    v_concurrency integer;
    v_tokens double precision;
    v_running integer;
    v_job_id uuid;
    v_tag double precision;
    v_next double precision;
    v_due timestamptz;
    n_locked integer;
    -- the class clock slot this claim raises
    v_slot integer;
    -- a domain state row this call made (none was there)
    n_made integer;
    k integer;
    kt integer;
    -- The jobs picked so far, passed to a query as CAST((SELECT picked) AS uuid[]): a
    -- subquery, so a copy of the array is made once per query, not once per row compared
    -- (a variable's array is copied for each row it is compared with).
    picked uuid[] := '{}';
    picked_at timestamptz[] := '{}';
    -- the domains this call holds locked, and their state as this call left it: tokens
    -- and tokens_at after its spends, rps, concurrency, pause, connections counted when
    -- locked (without this call's picks), this call's picks
    dc_domain text[] := '{}';
    dc_tokens double precision[] := '{}';
    dc_tokens_at timestamptz[] := '{}';
    dc_rps double precision[] := '{}';
    dc_concurrency integer[] := '{}';
    dc_blocked timestamptz[] := '{}';
    dc_running integer[] := '{}';
    dc_picks integer[] := '{}';
    -- the tenants this call picked from (their rows locked): class, id, start tag after
    -- this call's starts (written at the end)
    tc_priority text[] := '{}';
    tc_tenant uuid[] := '{}';
    tc_tag numeric[] := '{}';
    -- the flows whose head this call moved (written at the end)
    fh_domain text[] := '{}';
    fh_priority text[] := '{}';
    fh_tenant uuid[] := '{}';
    fh_head double precision[] := '{}';
    -- (class, tenant) left for the rest of this call: its ready flows all held by other
    -- claims, or parked by it
    pp_priority text[] := '{}';
    pp_tenant uuid[] := '{}';
    -- of the class being picked: the tenants passed, and those this call picked from
    v_passed uuid[];
    v_mine uuid[];
    -- domains whose state row another claim holds: left to it for the rest of this call
    v_domains_taken text[] := '{}';
    v_counted_now boolean;
    -- waiting for a tenant: the one locked, and those found with nothing to claim
    v_waited uuid;
    v_waited_empty uuid[] := '{}';
    v_lock_timeout text;
    v_bucket boolean;
    -- the tenants of the flows set aside together
    v_aside uuid[];
    w_flow tid[];
    w_tenant_row tid[];
BEGIN
    -- Every statement here takes a snapshot of its own (READ COMMITTED): a tenant is
    -- parked only on what the statement after its row's lock sees. In one snapshot for
    -- the whole call (REPEATABLE READ, SERIALIZABLE: an operator's transaction, or a
    -- database's default_transaction_isolation) intake committed meanwhile is missed and
    -- a tenant parked with a flow ready, its jobs stranded.
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RAISE EXCEPTION 'scraping.claim_jobs runs only under READ COMMITTED, not %',
            current_setting('transaction_isolation')
            USING ERRCODE = 'feature_not_supported',
                  HINT = 'Call it outside a REPEATABLE READ or SERIALIZABLE transaction; '
                         'where default_transaction_isolation is set, set it back for the '
                         'workers: ALTER ROLE ... SET default_transaction_isolation = '
                         '''read committed''.';
    END IF;
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;

    SELECT array_agg(60 / c.share ORDER BY array_position(c_name, c.priority)),
           array_agg(c.vtime ORDER BY array_position(c_name, c.priority)),
           array_agg(c.last_start ORDER BY array_position(c_name, c.priority)),
           array_agg(k.tenant_clock ORDER BY array_position(c_name, c.priority)),
           array_agg(k.start_clock ORDER BY array_position(c_name, c.priority)),
           max(c.last_start)
    INTO c_step, c_finish, c_start, c_tclock, c_sclock, v_clock
    FROM scraping.pick_classes c
    JOIN scraping.class_clocks k ON k.priority = c.priority;
    c_tclock0 := c_tclock;
    c_sclock0 := c_sclock;

    -- Flows whose wait is over come back into their tenant's pick, and a parked tenant of
    -- such a flow comes back at the class clock or its own tag, whichever is later (a
    -- bounded batch per call; rows another transaction holds are skipped, not waited for,
    -- and a flow whose tenant row is held stays for the next claim, so no tenant is left
    -- parked with a flow ready). The flow and its tenant row are taken together, so flows
    -- of a tenant held meanwhile (a producer's open transaction holds its row until it
    -- commits) are passed over, not counted in the batch (1,000 of them waking first
    -- would fill it and keep every other flow asleep). The clock is read into a variable
    -- first: compared with clock_timestamp() itself (volatile) the wake time is no index
    -- bound.
    v_now := clock_timestamp();
    SELECT array_agg(w.flow_row), array_agg(w.tenant_row)
    INTO w_flow, w_tenant_row
    FROM (
        SELECT f.ctid AS flow_row, t.ctid AS tenant_row
        FROM scraping.tenant_flows f
        JOIN scraping.tenant_queues t
          ON t.priority = f.priority AND t.tenant_id = f.tenant_id
        WHERE NOT f.ready AND f.wake_at <= v_now
        ORDER BY f.wake_at
        LIMIT 1000
        -- (the tenant's row first: a flow is not locked when its tenant is passed over)
        FOR NO KEY UPDATE OF t SKIP LOCKED
        FOR UPDATE OF f SKIP LOCKED
    ) w;
    IF w_flow IS NOT NULL THEN
        UPDATE scraping.tenant_flows f
        SET ready = true, waiting_for = NULL, wake_at = NULL
        WHERE f.ctid = ANY (w_flow);
        UPDATE scraping.tenant_queues t
        SET ready = true,
            start_tag = greatest(t.start_tag, c_sclock[array_position(c_name, t.priority)])
        WHERE t.ctid = ANY (w_tenant_row) AND NOT t.ready;
    END IF;

    <<picks>>
    WHILE n_picked < p_limit AND n_set_aside < MAX_SET_ASIDE LOOP
        -- 1. the class with the smallest start tag (ties: the higher class)
        ci := NULL;
        FOR k2 IN 1..3 LOOP
            CONTINUE WHEN c_done[k2];
            IF ci IS NULL OR greatest(c_finish[k2], v_clock) < greatest(c_finish[ci], v_clock)
            THEN
                ci := k2;
            END IF;
        END LOOP;
        EXIT picks WHEN ci IS NULL;

        <<tenants>>
        LOOP
            EXIT picks WHEN n_set_aside >= MAX_SET_ASIDE;
            -- 2. the class's unparked tenant with the smallest start tag. The tenants this
            -- call picked from already are compared by their tags as this call left them.
            v_passed := ARRAY(SELECT u.t FROM unnest(pp_priority, pp_tenant) AS u(p, t)
                              WHERE u.p = c_name[ci]);
            v_mine := ARRAY(SELECT u.t FROM unnest(tc_priority, tc_tenant) AS u(p, t)
                            WHERE u.p = c_name[ci]);
            SELECT t.tenant_id, t.start_tag, round(1 / tn.weight::numeric, 20)
            INTO v_tenant, v_tenant_tag, v_step
            FROM scraping.tenant_queues t
            JOIN scraping.tenants tn ON tn.id = t.tenant_id
            WHERE t.priority = c_name[ci] AND t.ready
              AND t.tenant_id <> ALL (v_passed)
              AND t.tenant_id <> ALL (v_mine)
            ORDER BY t.start_tag, t.tenant_id
            LIMIT 1
            FOR NO KEY UPDATE OF t SKIP LOCKED;
            IF NOT FOUND THEN
                v_tenant := NULL;
            END IF;
            kt := NULL;
            FOR k2 IN 1..cardinality(tc_tenant) LOOP
                CONTINUE WHEN tc_priority[k2] <> c_name[ci]
                    OR tc_tenant[k2] = ANY (v_passed);
                IF (kt IS NULL OR (tc_tag[k2], tc_tenant[k2]) < (tc_tag[kt], tc_tenant[kt]))
                THEN
                    kt := k2;
                END IF;
            END LOOP;
            IF kt IS NOT NULL AND (v_tenant IS NULL
                    OR (tc_tag[kt], tc_tenant[kt]) < (v_tenant_tag, v_tenant))
            THEN
                v_tenant := tc_tenant[kt];
                SELECT round(1 / tn.weight::numeric, 20) INTO v_step
                FROM scraping.tenants tn WHERE tn.id = v_tenant;
            ELSIF v_tenant IS NULL THEN
                -- Every tenant of the class with claimable work is being claimed from by
                -- other claims: wait for the first of them rather than answer "nothing to
                -- do", then probe again. Each wait is a subtransaction: when the claim
                -- waited for left that tenant with nothing to claim, its lock is let go
                -- again and the next one is waited for. A wait lasts at most half a
                -- second: the row may be held by intake (a producer's transaction, see
                -- docs/integration.md, holds it until it commits), and a wait that closes
                -- a cycle with another claim's (the deadlock detector, or the timeout,
                -- ends it) only ends this class's picks: no claim fails or stalls for it.
                v_waited_empty := '{}';
                v_lock_timeout := current_setting('lock_timeout');
                PERFORM set_config('lock_timeout', '500ms', true);
                FOR n_wait IN 1..100 LOOP
                    v_waited := NULL;
                    BEGIN
                        SELECT t.tenant_id INTO v_waited FROM scraping.tenant_queues t
                        WHERE t.priority = c_name[ci] AND t.ready
                          AND t.tenant_id <> ALL (v_waited_empty)
                          AND t.tenant_id <> ALL (v_passed)
                          AND t.tenant_id <> ALL (v_mine)
                        ORDER BY t.start_tag, t.tenant_id
                        LIMIT 1
                        FOR NO KEY UPDATE;
                        IF v_waited IS NOT NULL
                           AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                                           WHERE f.priority = c_name[ci]
                                             AND f.tenant_id = v_waited AND f.ready)
                        THEN
                            RAISE EXCEPTION 'nothing to claim';
                        END IF;
                    EXCEPTION
                        WHEN raise_exception THEN
                            v_waited_empty := v_waited_empty || v_waited;
                            v_waited := NULL;
                            CONTINUE;
                        WHEN lock_not_available OR deadlock_detected THEN
                            v_waited := NULL;
                    END;
                    EXIT;
                END LOOP;
                PERFORM set_config('lock_timeout', v_lock_timeout, true);
                IF v_waited IS NOT NULL THEN
                    CONTINUE tenants;
                END IF;
                c_done[ci] := true;
                CONTINUE picks;
            ELSE
                kt := NULL;
            END IF;
            IF kt IS NULL THEN
                tc_priority := tc_priority || c_name[ci];
                tc_tenant := tc_tenant || v_tenant;
                tc_tag := tc_tag || v_tenant_tag;
                kt := cardinality(tc_tenant);
            END IF;

            <<flows>>
            LOOP
                -- 3. the tenant's ready flow with the smallest head, locked, then its
                -- domain's row (both SKIP LOCKED), and the domain's connections counted
                -- unless this call holds the domain already
                SELECT f1.domain, dd.domain IS NOT NULL AS domain_locked,
                       dd.tokens, dd.tokens_at, dd.blocked_until, dd.rps, dd.concurrency,
                       CASE WHEN dd.domain IS NOT NULL AND f1.domain <> ALL (dc_domain) THEN
                           (SELECT count(*) FROM scraping.jobs j
                            WHERE j.status = 'running' AND j.domain = f1.domain)
                           + (SELECT count(*) FROM scraping.redirect_slots s
                              WHERE s.domain = f1.domain AND s.expires_at > clock_timestamp())
                       END AS running,
                       dd.locked_ctid = (SELECT d2.ctid FROM scraping.domains d2
                                         WHERE d2.domain = f1.domain) AS counted_under_lock
                INTO v_probe
                FROM (
                    SELECT f.domain
                    FROM scraping.tenant_flows f
                    WHERE f.priority = c_name[ci] AND f.tenant_id = v_tenant
                      AND f.ready AND f.domain <> ALL (v_domains_taken)
                    ORDER BY f.head_tag, f.domain
                    LIMIT 1
                    FOR UPDATE OF f SKIP LOCKED
                ) f1
                LEFT JOIN LATERAL (
                    SELECT d.domain, d.tokens, d.tokens_at, d.blocked_until, d.rps,
                           d.concurrency, d.ctid AS locked_ctid
                    FROM scraping.domains d
                    WHERE d.domain = f1.domain
                    FOR UPDATE SKIP LOCKED
                ) dd ON true;
                IF NOT FOUND THEN
                    IF EXISTS (SELECT 1 FROM scraping.tenant_flows f
                               WHERE f.priority = c_name[ci]
                                 AND f.tenant_id = v_tenant AND f.ready) THEN
                        -- its ready flows are other claims' (or on their domains) for now
                        pp_priority := pp_priority || c_name[ci];
                        pp_tenant := pp_tenant || v_tenant;
                    ELSE
                        -- Nothing of it can be claimed: parked, its tag standing still,
                        -- until one of its flows wakes or intake brings a claimable job.
                        UPDATE scraping.tenant_queues t
                        SET ready = false, start_tag = tc_tag[kt]
                        WHERE t.priority = c_name[ci] AND t.tenant_id = v_tenant;
                        pp_priority := pp_priority || c_name[ci];
                        pp_tenant := pp_tenant || v_tenant;
                        n_set_aside := n_set_aside + 1;
                    END IF;
                    CONTINUE tenants;
                END IF;
                IF NOT v_probe.domain_locked THEN
                    IF NOT EXISTS (SELECT 1 FROM scraping.domains d
                                   WHERE d.domain = v_probe.domain) THEN
                        -- No state row at all (an operator deleted it while intake was
                        -- announcing the domain's first jobs: the delete saw none of them,
                        -- so made none again): made here, then probed again. Left
                        -- without one, the domain would pass for held by another claim at
                        -- every claim and its jobs never start. The insert waits at most
                        -- half a second (for another transaction making the row).
                        v_lock_timeout := current_setting('lock_timeout');
                        PERFORM set_config('lock_timeout', '500ms', true);
                        BEGIN
                            INSERT INTO scraping.domains (domain) VALUES (v_probe.domain)
                            ON CONFLICT (domain) DO NOTHING;
                            GET DIAGNOSTICS n_made = ROW_COUNT;
                        EXCEPTION WHEN lock_not_available OR deadlock_detected THEN
                            n_made := 0;
                        END;
                        PERFORM set_config('lock_timeout', v_lock_timeout, true);
                        IF n_made = 1 THEN
                            CONTINUE flows;
                        END IF;
                    END IF;
                    v_domains_taken := v_domains_taken || v_probe.domain;
                    CONTINUE flows;
                END IF;
                v_fdomain := v_probe.domain;
                v_now := clock_timestamp();

                k := array_position(dc_domain, v_fdomain);
                v_counted_now := k IS NULL;
                IF k IS NULL THEN
                    IF v_probe.counted_under_lock IS NOT TRUE THEN
                        -- another claim committed on this domain after the probe's snapshot
                        SELECT (SELECT count(*) FROM scraping.jobs j
                                WHERE j.status = 'running' AND j.domain = v_fdomain)
                             + (SELECT count(*) FROM scraping.redirect_slots s
                                WHERE s.domain = v_fdomain AND s.expires_at > v_now)
                        INTO v_running;
                    ELSE
                        v_running := v_probe.running;
                    END IF;
                    dc_domain := dc_domain || v_fdomain;
                    dc_tokens := dc_tokens || v_probe.tokens;
                    dc_tokens_at := dc_tokens_at || v_probe.tokens_at;
                    dc_rps := dc_rps || coalesce(v_probe.rps, p_default_rps);
                    dc_concurrency := dc_concurrency
                        || coalesce(v_probe.concurrency, p_default_concurrency);
                    dc_blocked := dc_blocked || v_probe.blocked_until;
                    dc_running := dc_running || v_running;
                    dc_picks := dc_picks || 0;
                    k := cardinality(dc_domain);
                END IF;

                -- 4. room: no pause, a token in the bucket, a free connection; without it
                -- the flow is set aside until the pause ends, the next token, or (a
                -- connection) a finishing job wakes it (wake_room_flows, which waits for a
                -- claim holding the domain's row, so it sees what that claim set aside),
                -- with a minute as a safety net (a redirect hop's slot that lapsed)
                v_due := NULL;
                v_bucket := false;
                v_rps := dc_rps[k];
                v_concurrency := dc_concurrency[k];
                IF dc_blocked[k] > v_now THEN
                    v_due := dc_blocked[k];
                ELSE
                    v_domain.tokens := dc_tokens[k];
                    v_domain.tokens_at := dc_tokens_at[k];
                    v_tokens := scraping.domain_tokens(v_domain, v_rps, v_now);
                    IF v_tokens < 1 THEN
                        v_due := v_now + make_interval(secs => (1 - v_tokens) / v_rps);
                        v_bucket := true;
                    ELSE
                        IF NOT v_counted_now AND dc_running[k] + dc_picks[k] >= v_concurrency
                        THEN
                            -- counted when this call locked it: a job may have finished since
                            SELECT (SELECT count(*) FROM scraping.jobs j
                                    WHERE j.status = 'running' AND j.domain = v_fdomain)
                                 + (SELECT count(*) FROM scraping.redirect_slots s
                                    WHERE s.domain = v_fdomain AND s.expires_at > v_now)
                            INTO v_running;
                            dc_running[k] := v_running;
                        END IF;
                        v_running := dc_running[k] + dc_picks[k];
                        IF v_running >= v_concurrency THEN
                            v_due := v_now + interval '60 seconds';
                        END IF;
                    END IF;
                END IF;
                IF v_due IS NOT NULL THEN
                    -- The domain's ready flows of the class go aside together (up to 1000,
                    -- this one first, then by head): waiting for the bucket, one a token
                    -- apart, so they come back one per token, not all at once; for a
                    -- pause or a connection, until then. Their tenants left with nothing
                    -- to claim are parked with them (rows other transactions hold are left
                    -- to the claims that meet them): locked first, then parked by a
                    -- statement of its own when they still have no flow ready. Its
                    -- snapshot sees every intake that held a tenant's row before the lock
                    -- (intake of a ready tenant holds its row FOR SHARE, no new version:
                    -- checked in the locking statement's snapshot, a flow intake committed
                    -- in between was missed, and the tenant parked with it ready); intake
                    -- after the lock waits for this claim and brings back what it parked.
                    v_aside := ARRAY(
                        SELECT DISTINCT w.tenant_id FROM scraping.set_domain_flows_aside(
                            v_fdomain, c_name[ci], v_tenant, v_due,
                            CASE WHEN v_bucket THEN 1 / v_rps ELSE 0 END) AS w);
                    w_tenant_row := ARRAY(
                        SELECT p.row_id FROM unnest(v_aside) AS u(tenant_id)
                        CROSS JOIN LATERAL (
                            SELECT t2.ctid AS row_id FROM scraping.tenant_queues t2
                            WHERE t2.priority = c_name[ci] AND t2.tenant_id = u.tenant_id
                              AND t2.ready
                              AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                                              WHERE f.priority = t2.priority
                                                AND f.tenant_id = t2.tenant_id AND f.ready)
                            FOR NO KEY UPDATE SKIP LOCKED) p);
                    UPDATE scraping.tenant_queues t SET ready = false
                    WHERE t.ctid = ANY (w_tenant_row)
                      AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                                      WHERE f.priority = t.priority
                                        AND f.tenant_id = t.tenant_id AND f.ready);
                    n_set_aside := n_set_aside + 1 + cardinality(v_aside) / 16;
                    EXIT picks WHEN n_set_aside >= MAX_SET_ASIDE;
                    CONTINUE flows;
                END IF;

                -- 5. the flow's due job with the smallest tag, never one asked to cancel,
                -- and the tag the flow's head has once it is picked
                SELECT h.id, h.fair_tag,
                       (SELECT j.fair_tag FROM scraping.jobs j
                        WHERE j.domain = v_fdomain AND j.priority = c_name[ci]
                          AND j.tenant_id = v_tenant
                          AND j.status = 'queued' AND j.id <> h.id
                          AND j.id <> ALL (CAST((SELECT picked) AS uuid[]))
                        ORDER BY j.fair_tag, j.id
                        LIMIT 1)
                INTO v_job_id, v_tag, v_next
                FROM (
                    SELECT j.id, j.fair_tag FROM scraping.jobs j
                    WHERE j.domain = v_fdomain AND j.priority = c_name[ci]
                      AND j.tenant_id = v_tenant
                      AND j.status = 'queued' AND j.next_attempt_at <= v_now
                      AND j.cancel_requested_at IS NULL
                      AND j.id <> ALL (CAST((SELECT picked) AS uuid[]))
                    ORDER BY j.fair_tag, j.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                ) h;
                IF NOT FOUND THEN
                    SELECT min(j.next_attempt_at) INTO v_due FROM scraping.jobs j
                    WHERE j.domain = v_fdomain AND j.priority = c_name[ci]
                      AND j.tenant_id = v_tenant
                      AND j.status = 'queued' AND j.cancel_requested_at IS NULL
                      AND j.id <> ALL (CAST((SELECT picked) AS uuid[]));
                    IF v_due IS NULL THEN
                        DELETE FROM scraping.tenant_flows f
                        WHERE f.domain = v_fdomain AND f.priority = c_name[ci]
                          AND f.tenant_id = v_tenant;
                        PERFORM scraping.drop_empty_domain_queue(v_fdomain, c_name[ci]);
                    ELSE
                        -- Not due yet (until it is), or its due jobs held by another
                        -- transaction (a cancel: a second).
                        UPDATE scraping.tenant_flows f
                        SET ready = false, waiting_for = 'due',
                            wake_at = CASE WHEN v_due > v_now THEN v_due
                                           ELSE v_now + interval '1 second' END
                        WHERE f.domain = v_fdomain AND f.priority = c_name[ci]
                          AND f.tenant_id = v_tenant;
                        n_set_aside := n_set_aside + 1;
                        EXIT picks WHEN n_set_aside >= MAX_SET_ASIDE;
                    END IF;
                    CONTINUE flows;
                END IF;

                -- The pick: spend the domain's token and connection, the tenant's turn
                -- (written at the end), advance the clocks. The jobs are claimed together
                -- at the end, each stamped with its pick's moment.
                picked := picked || v_job_id;
                picked_at := picked_at || v_now;
                n_picked := n_picked + 1;
                dc_tokens[k] := v_tokens - 1;
                dc_tokens_at[k] := greatest(v_now, dc_tokens_at[k]);
                dc_picks[k] := dc_picks[k] + 1;
                IF v_next IS NULL THEN
                    DELETE FROM scraping.tenant_flows f
                    WHERE f.domain = v_fdomain AND f.priority = c_name[ci]
                      AND f.tenant_id = v_tenant;
                    PERFORM scraping.drop_empty_domain_queue(v_fdomain, c_name[ci]);
                ELSE
                    fh_domain := fh_domain || v_fdomain;
                    fh_priority := fh_priority || c_name[ci];
                    fh_tenant := fh_tenant || v_tenant;
                    fh_head := fh_head || v_next;
                END IF;
                c_sclock[ci] := greatest(c_sclock[ci], tc_tag[kt]);
                tc_tag[kt] := tc_tag[kt] + v_step;
                c_tclock[ci] := greatest(c_tclock[ci], v_tag);
                v_clock := greatest(c_finish[ci], v_clock);
                c_start[ci] := v_clock;
                c_finish[ci] := v_clock + c_step[ci];
                CONTINUE picks;
            END LOOP flows;
        END LOOP tenants;
    END LOOP picks;

    -- the tenants' start tags and the flows' heads as this call left them
    UPDATE scraping.tenant_queues t
    SET start_tag = u.tag
    FROM unnest(tc_priority, tc_tenant, tc_tag) AS u(priority, tenant_id, tag)
    WHERE t.priority = u.priority AND t.tenant_id = u.tenant_id
      AND t.start_tag <> u.tag;
    UPDATE scraping.tenant_flows f
    SET head_tag = u.head
    FROM (SELECT DISTINCT ON (x.domain, x.priority, x.tenant_id) x.*
          FROM unnest(fh_domain, fh_priority, fh_tenant, fh_head) WITH ORDINALITY
              AS x(domain, priority, tenant_id, head, o)
          ORDER BY x.domain, x.priority, x.tenant_id, x.o DESC) u
    WHERE f.domain = u.domain AND f.priority = u.priority AND f.tenant_id = u.tenant_id;
    IF n_picked = 0 THEN
        RETURN;
    END IF;
    UPDATE scraping.domains d
    SET tokens = u.tokens, tokens_at = greatest(u.tokens_at, d.tokens_at)
    FROM unnest(dc_domain, dc_tokens, dc_tokens_at, dc_picks)
        AS u(domain, tokens, tokens_at, picks)
    WHERE d.domain = u.domain AND u.picks > 0;

    RETURN QUERY
    WITH claimed AS (
        UPDATE scraping.jobs j
        SET status = 'running',
            attempts = j.attempts + 1,
            lease_owner = p_worker,
            lease_expires_at = p.at + make_interval(secs => p_lease_seconds),
            started_at = coalesce(j.started_at, p.at),
            updated_at = p.at
        FROM unnest(picked, picked_at) AS p(id, at)
        WHERE j.id = p.id
        RETURNING j.*
    ), attempt AS (
        INSERT INTO scraping.job_attempts (job_id, number, worker, started_at)
        SELECT c.id, c.attempts, p_worker, c.updated_at FROM claimed c
    )
    SELECT c.* FROM claimed c
    JOIN unnest(picked) WITH ORDINALITY AS p(id, o) ON p.id = c.id
    ORDER BY p.o;

    -- The class state, written last, so its rows are held only until the commit. The
    -- class sequence, unless another claim is writing it right now: then that write
    -- stands (both continued the sequence from the same point) and this claim does not
    -- wait; all three rows or none, so it stays one point of the sequence. (NO KEY:
    -- intake's foreign-key checks on these rows neither wait for it nor make it skip.)
    PERFORM 1 FROM scraping.pick_classes FOR NO KEY UPDATE SKIP LOCKED;
    GET DIAGNOSTICS n_locked = ROW_COUNT;
    IF n_locked = 3 THEN
        UPDATE scraping.pick_classes c
        SET vtime = c_finish[ck], last_start = c_start[ck]
        FROM generate_subscripts(c_name, 1) AS ck
        WHERE c.priority = c_name[ck];
    END IF;
    -- The class clocks, whenever a pick moved them: they only grow, so they go into
    -- whichever of the eight slots no other claim holds (claimers at once try them from
    -- different slots, by backend). All eight held (eight claims committing at once), it
    -- waits for one, whose holder has nothing left but its commit. The slot is locked
    -- first and then written by its key in a statement of its own: a slot another claim
    -- committed after the locking statement's snapshot is locked in its new version,
    -- which that snapshot does not see (matched by ctid there, no row was written and
    -- the claim waited for its fall-back slot with others free).
    IF c_tclock <> c_tclock0 OR c_sclock <> c_sclock0 THEN
        SELECT s.slot INTO v_slot FROM scraping.pick_class_clocks s
        ORDER BY (s.slot + pg_backend_pid()) % 8
        LIMIT 1
        FOR NO KEY UPDATE SKIP LOCKED;
        UPDATE scraping.pick_class_clocks s
        SET tenant_clock = ARRAY[greatest(s.tenant_clock[1], c_tclock[1]),
                                 greatest(s.tenant_clock[2], c_tclock[2]),
                                 greatest(s.tenant_clock[3], c_tclock[3])],
            exact_start_clock = ARRAY[greatest(s.exact_start_clock[1], c_sclock[1]),
                                      greatest(s.exact_start_clock[2], c_sclock[2]),
                                      greatest(s.exact_start_clock[3], c_sclock[3])]
        WHERE s.slot = coalesce(v_slot, pg_backend_pid() % 8);
    END IF;
END
$fn$;
