-- 0047: the claim and a pause's parking run only under READ COMMITTED. 0045 parks a
-- tenant by a statement after the one that locked its row, whose snapshot sees the intake
-- that held the row before; in a transaction of one snapshot (REPEATABLE READ or
-- SERIALIZABLE: an operator's, or a database's default_transaction_isolation) it sees
-- none of it, and a tenant was parked with a flow ready again, its jobs stranded. The
-- claim now refuses to run there, naming the fix; a pause there sets its domain's flows
-- aside and leaves the parking to the claims that meet their tenants.

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

CREATE OR REPLACE FUNCTION scraping.domains_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_tenant_rows tid[];
BEGIN
    IF NEW.blocked_until > clock_timestamp() THEN
        UPDATE scraping.domain_queues q
        SET ready = false, waiting_for = 'room', wake_at = NEW.blocked_until
        WHERE q.domain = NEW.domain
          AND (q.ready OR q.wake_at IS DISTINCT FROM NEW.blocked_until);
        UPDATE scraping.tenant_flows f
        SET ready = false, waiting_for = 'room', wake_at = NEW.blocked_until
        WHERE f.domain = NEW.domain
          AND (f.ready OR f.wake_at IS DISTINCT FROM NEW.blocked_until);
        -- Their tenants left with no flow ready are parked now rather than by the next
        -- claim to meet them (a tenant row a claim or intake holds is left to it): locked
        -- first, then parked by a statement of its own when they still have no flow
        -- ready, whose snapshot sees every intake that held the row before the lock (as
        -- the claim's set-aside does, claim_jobs.sql). Only under READ COMMITTED: in a
        -- transaction of one snapshot (an operator's REPEATABLE READ) that statement
        -- would miss intake committed meanwhile; the claims that meet them park them.
        IF current_setting('transaction_isolation') <> 'read committed' THEN
            RETURN NULL;
        END IF;
        v_tenant_rows := ARRAY(
            SELECT t2.ctid FROM scraping.tenant_queues t2
            WHERE (t2.priority, t2.tenant_id) IN (
                    SELECT f.priority, f.tenant_id FROM scraping.tenant_flows f
                    WHERE f.domain = NEW.domain)
              AND t2.ready
              AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                              WHERE f.priority = t2.priority
                                AND f.tenant_id = t2.tenant_id AND f.ready)
            FOR NO KEY UPDATE SKIP LOCKED);
        UPDATE scraping.tenant_queues t SET ready = false
        WHERE t.ctid = ANY (v_tenant_rows)
          AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                          WHERE f.priority = t.priority
                            AND f.tenant_id = t.tenant_id AND f.ready);
    ELSE
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = NEW.domain AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp();
        UPDATE scraping.tenant_flows f SET wake_at = clock_timestamp()
        WHERE f.domain = NEW.domain AND f.waiting_for = 'room'
          AND f.wake_at > clock_timestamp();
    END IF;
    RETURN NULL;
END
$fn$;
