--
-- PostgreSQL database dump
--

--
-- Name: chessboard; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA chessboard;

--
-- Name: news; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA news;

--
-- Name: pin; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA pin;

--
-- Name: scraping; Type: SCHEMA; Schema: -; Owner: -
--

CREATE SCHEMA scraping;

--
-- Name: request_project_recalc(uuid, uuid, text); Type: FUNCTION; Schema: chessboard; Owner: -
--

CREATE FUNCTION chessboard.request_project_recalc(project_id uuid, tenant_id uuid, reason text) RETURNS timestamp with time zone
    LANGUAGE sql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
            -- The policy of RecalcPolicy's defaults: debounce 30 s, cap 5 min.
            SELECT chessboard.request_project_recalc_at($1, $2, $3, now(), 30, 300)
        $_$;

--
-- Name: request_project_recalc_at(uuid, uuid, text, timestamp with time zone, double precision, double precision); Type: FUNCTION; Schema: chessboard; Owner: -
--

CREATE FUNCTION chessboard.request_project_recalc_at(project_id uuid, tenant_id uuid, reason text, requested_at timestamp with time zone, debounce_seconds double precision, cap_seconds double precision) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
        DECLARE
            p_project_id ALIAS FOR $1;
            p_tenant_id ALIAS FOR $2;
            p_reason ALIAS FOR $3;
            p_requested_at ALIAS FOR $4;
            p_debounce ALIAS FOR $5;
            p_cap ALIAS FOR $6;
            allowed text[] := ARRAY['PropertyObjectStatusChanged', 'PropertyObjectPriceChanged', 'PropertyObjectUpserted', 'LayoutChanged', 'TalentSync', 'Crud', 'Manual']::text[];
            due timestamptz;
        BEGIN
            IF p_project_id IS NULL THEN
                RAISE EXCEPTION 'project_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the id of the project whose aggregates are stale';
            END IF;
            IF p_tenant_id IS NULL THEN
                RAISE EXCEPTION 'tenant_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the tenant id of the project';
            END IF;
            IF p_reason IS NULL OR NOT (p_reason = ANY (allowed)) THEN
                RAISE EXCEPTION 'reason must be one of % (got %)',
                        array_to_string(allowed, ', '), coalesce(quote_literal(p_reason), 'NULL')
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF p_requested_at IS NULL OR p_debounce IS NULL OR p_cap IS NULL
               OR p_debounce <= 0 OR p_cap < p_debounce THEN
                RAISE EXCEPTION 'requested_at, debounce_seconds and cap_seconds must be set, '
                                'with 0 < debounce_seconds <= cap_seconds (got %, %, %)',
                        p_requested_at, p_debounce, p_cap
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- Trailing debounce with a starvation cap (seed 002, AGG-1): a new row is due
            -- debounce after the request; a further request moves it to request + debounce,
            -- never past first_requested_at + cap.
            INSERT INTO chessboard.project_recalc_requests AS r (
                project_id, tenant_id, due_at, first_requested_at, requested_count,
                last_reason, attempt_count, created_at, updated_at
            )
            VALUES (
                p_project_id, p_tenant_id,
                p_requested_at + make_interval(secs => p_debounce), p_requested_at, 1,
                p_reason, 0, p_requested_at, p_requested_at
            )
            ON CONFLICT ON CONSTRAINT project_recalc_requests_pkey DO UPDATE
            SET due_at = least(
                    excluded.updated_at + make_interval(secs => p_debounce),
                    r.first_requested_at + make_interval(secs => p_cap)
                ),
                requested_count = r.requested_count + 1,
                last_reason = excluded.last_reason,
                tenant_id = excluded.tenant_id,
                updated_at = excluded.updated_at
            RETURNING r.due_at INTO due;
            RETURN due;
        END
        $_$;

--
-- Name: enqueue_snapshot_detach(uuid, uuid, text); Type: FUNCTION; Schema: news; Owner: -
--

CREATE FUNCTION news.enqueue_snapshot_detach(snapshot_id uuid, post_id uuid, reason text) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $_$
        #variable_conflict use_column
        DECLARE
            p_snapshot_id ALIAS FOR $1;
            p_post_id ALIAS FOR $2;
            p_reason ALIAS FOR $3;
            allowed text[] := ARRAY['BlockReplaced', 'PostDeleted']::text[];
            entry_id uuid;
        BEGIN
            IF p_snapshot_id IS NULL THEN
                RAISE EXCEPTION 'snapshot_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the id of the orphaned selection snapshot';
            END IF;
            IF p_post_id IS NULL THEN
                RAISE EXCEPTION 'post_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the id of the post the snapshot belonged to';
            END IF;
            IF p_reason IS NULL OR NOT (p_reason = ANY (allowed)) THEN
                RAISE EXCEPTION 'reason must be one of % (got %)',
                        array_to_string(allowed, ', '), coalesce(quote_literal(p_reason), 'NULL')
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- One active (not Done) row per snapshot (ux_sdo_snapshot). When the insert
            -- meets an active row, that row may turn Done (committed by the worker) before
            -- the lookup reads it: the lookup then finds nothing, and the insert is tried
            -- again, now without a conflict. Each statement sees rows committed before it
            -- started, so the loop ends unless that race repeats.
            LOOP
                INSERT INTO news.snapshot_detach_outbox AS o (
                    id, snapshot_id, post_id, reason, attempts, next_attempt_at, status,
                    created_at, updated_at
                )
                VALUES (pin.uuid7(), p_snapshot_id, p_post_id, p_reason, 0, now(), 'Pending',
                        now(), now())
                ON CONFLICT (snapshot_id) WHERE status <> 'Done' DO NOTHING
                RETURNING o.id INTO entry_id;
                IF entry_id IS NOT NULL THEN
                    RETURN entry_id;
                END IF;
                SELECT o.id INTO entry_id
                FROM news.snapshot_detach_outbox AS o
                WHERE o.snapshot_id = p_snapshot_id AND o.status <> 'Done';
                IF entry_id IS NOT NULL THEN
                    RETURN entry_id;
                END IF;
            END LOOP;
        END
        $_$;

--
-- Name: uuid7(); Type: FUNCTION; Schema: pin; Owner: -
--

CREATE FUNCTION pin.uuid7() RETURNS uuid
    LANGUAGE sql PARALLEL SAFE
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
            SELECT encode(
                set_bit(set_bit(
                    overlay(uuid_send(gen_random_uuid())
                            PLACING substring(int8send(
                                floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                FROM 3)
                            FROM 1 FOR 6),
                    52, 1), 53, 1),
                'hex')::uuid
        $$;

--
-- Name: advance_job_updated_at(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.advance_job_updated_at() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            NEW.updated_at := OLD.updated_at + interval '1 microsecond';
            RETURN NEW;
        END
        $$;

--
-- Name: announce_queued_jobs(text, text, uuid, double precision, timestamp with time zone); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.announce_queued_jobs(p_domain text, p_priority text, p_tenant_id uuid, p_head_tag double precision, p_due_at timestamp with time zone) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_blocked timestamptz;
    v_ready boolean;
BEGIN
    -- The common case writes nothing: a queue and a flow that already sort at or before
    -- these jobs and do not wait for a later due time. Read under a KEY SHARE lock: a
    -- claim holding the row (FOR UPDATE) may be about to delete it (it took the last job it
    -- saw) or set it aside until a later due time, so this waits for that claim and reads
    -- what it left; read without the lock, the jobs were announced to a row the claim then
    -- deleted, and were never claimed again.
    PERFORM 1 FROM scraping.domain_queues q
    WHERE q.domain = p_domain AND q.priority = p_priority
      AND q.head_tag <= p_head_tag
      AND (q.ready OR q.waiting_for = 'room' OR q.wake_at <= p_due_at)
    FOR KEY SHARE;
    IF NOT FOUND THEN
        INSERT INTO scraping.domains (domain) VALUES (p_domain)
        ON CONFLICT (domain) DO NOTHING;
        SELECT d.blocked_until INTO v_blocked FROM scraping.domains d
        WHERE d.domain = p_domain AND d.blocked_until > clock_timestamp();
        INSERT INTO scraping.domain_queues AS q
            (domain, priority, head_tag, ready, waiting_for, wake_at)
        SELECT p_domain, p_priority, p_head_tag, s.waiting_for IS NULL,
               s.waiting_for, s.wake_at
        FROM (SELECT CASE WHEN v_blocked IS NOT NULL THEN 'room'
                          WHEN p_due_at > clock_timestamp() THEN 'due'
                     END AS waiting_for,
                     coalesce(v_blocked, CASE WHEN p_due_at > clock_timestamp()
                                              THEN p_due_at END) AS wake_at) s
        ON CONFLICT (domain, priority) DO UPDATE
        SET head_tag = least(q.head_tag, EXCLUDED.head_tag),
            wake_at = CASE WHEN q.waiting_for = 'due'
                           THEN least(q.wake_at, p_due_at)
                           ELSE q.wake_at END;
    END IF;

    PERFORM 1 FROM scraping.tenant_flows f
    WHERE f.domain = p_domain AND f.priority = p_priority AND f.tenant_id = p_tenant_id
      AND f.head_tag <= p_head_tag
      AND (f.ready OR f.waiting_for = 'room' OR f.wake_at <= p_due_at)
    FOR KEY SHARE;
    IF FOUND THEN
        RETURN;
    END IF;
    SELECT d.blocked_until INTO v_blocked FROM scraping.domains d
    WHERE d.domain = p_domain AND d.blocked_until > clock_timestamp();
    INSERT INTO scraping.tenant_flows AS f
        (domain, priority, tenant_id, head_tag, ready, waiting_for, wake_at)
    SELECT p_domain, p_priority, p_tenant_id, p_head_tag, s.waiting_for IS NULL,
           s.waiting_for, s.wake_at
    FROM (SELECT CASE WHEN v_blocked IS NOT NULL THEN 'room'
                      WHEN p_due_at > clock_timestamp() THEN 'due'
                 END AS waiting_for,
                 coalesce(v_blocked, CASE WHEN p_due_at > clock_timestamp()
                                          THEN p_due_at END) AS wake_at) s
    ON CONFLICT (domain, priority, tenant_id) DO UPDATE
    SET head_tag = least(f.head_tag, EXCLUDED.head_tag),
        wake_at = CASE WHEN f.waiting_for = 'due'
                       THEN least(f.wake_at, p_due_at)
                       ELSE f.wake_at END
    RETURNING f.ready INTO v_ready;

    -- The tenant's row in the class. A flow that can be claimed now brings a parked tenant
    -- back, at the class clock or its own start tag, whichever is later (no credit banked
    -- while it had nothing to claim). Read under a SHARE lock: a claim holding the row may
    -- be parking it (it saw none of its flows ready, this one not yet committed), so this
    -- waits for that claim and reads what it left.
    PERFORM 1 FROM scraping.tenant_queues t
    WHERE t.priority = p_priority AND t.tenant_id = p_tenant_id AND (t.ready OR NOT v_ready)
    FOR SHARE;
    IF FOUND THEN
        RETURN;
    END IF;
    INSERT INTO scraping.tenant_queues AS t (priority, tenant_id, start_tag, ready)
    SELECT p_priority, p_tenant_id, c.start_clock, true
    FROM scraping.class_clocks c WHERE c.priority = p_priority
    ON CONFLICT (priority, tenant_id) DO UPDATE
    SET ready = true, start_tag = greatest(t.start_tag, EXCLUDED.start_tag)
    WHERE NOT t.ready AND v_ready;
END
$$;

--
-- Name: jobs; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.jobs (
    id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    url text NOT NULL,
    params jsonb DEFAULT '{}'::jsonb NOT NULL,
    priority text DEFAULT 'normal'::text NOT NULL,
    callback_url text,
    idempotency_key text,
    request_sha256 text,
    status text DEFAULT 'queued'::text NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    attempts_before_requeue integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    lease_owner text,
    lease_expires_at timestamp with time zone,
    cancel_requested_at timestamp with time zone,
    last_error text,
    last_error_class text,
    result_key text,
    result_size bigint,
    result_sha256 text,
    result_content_type text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    started_at timestamp with time zone,
    finished_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    domain text NOT NULL,
    finish_published_at timestamp with time zone,
    webhook_attempts integer DEFAULT 0 NOT NULL,
    webhook_next_attempt_at timestamp with time zone,
    result_expired_at timestamp with time zone,
    fair_tag double precision,
    attempt_objects_swept_at timestamp with time zone,
    timeout_seconds double precision,
    robots_waits integer DEFAULT 0 NOT NULL,
    CONSTRAINT jobs_callback_url_check CHECK ((length(callback_url) <= 2048)),
    CONSTRAINT jobs_check CHECK (((status = 'running'::text) = (lease_expires_at IS NOT NULL))),
    CONSTRAINT jobs_check1 CHECK (((status <> 'succeeded'::text) OR (result_key IS NOT NULL))),
    CONSTRAINT jobs_idempotency_key_check CHECK ((length(idempotency_key) <= 255)),
    CONSTRAINT jobs_last_error_check CHECK ((length(last_error) <= 512)),
    CONSTRAINT jobs_priority_check CHECK ((priority = ANY (ARRAY['high'::text, 'normal'::text, 'low'::text]))),
    CONSTRAINT jobs_robots_waits_check CHECK ((robots_waits >= 0)),
    CONSTRAINT jobs_status_check CHECK ((status = ANY (ARRAY['queued'::text, 'running'::text, 'succeeded'::text, 'failed'::text, 'cancelled'::text]))),
    CONSTRAINT jobs_timeout_seconds_check CHECK ((timeout_seconds > (0)::double precision)),
    CONSTRAINT jobs_url_check CHECK ((length(url) <= 2048))
);

--
-- Name: claim_jobs(text, integer, double precision, double precision, integer); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.claim_jobs(p_worker text, p_limit integer, p_lease_seconds double precision, p_default_rps double precision, p_default_concurrency integer) RETURNS SETOF scraping.jobs
    LANGUAGE plpgsql
    SET plan_cache_mode TO 'force_generic_plan'
    AS $$
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
$$;

--
-- Name: domains; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.domains (
    domain text NOT NULL,
    rps double precision,
    concurrency integer,
    tokens double precision,
    tokens_at timestamp with time zone,
    blocked_until timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    configured_rps double precision,
    crawl_delay double precision,
    robots_default_rps double precision,
    robots_mode text,
    robots_reason text,
    robots_set_by text,
    robots_set_at timestamp with time zone,
    pause_cause text,
    CONSTRAINT domains_concurrency_check CHECK (((concurrency > 0) AND (concurrency <= 10000))),
    CONSTRAINT domains_configured_rps_check CHECK (((configured_rps >= (0.01)::double precision) AND (configured_rps <= (10000)::double precision))),
    CONSTRAINT domains_crawl_delay_check CHECK ((crawl_delay >= (0)::double precision)),
    CONSTRAINT domains_pause_cause_check CHECK ((pause_cause = ANY (ARRAY['operator'::text, 'retry_after'::text]))),
    CONSTRAINT domains_robots_mode_check CHECK ((robots_mode = ANY (ARRAY['obey'::text, 'ignore'::text]))),
    CONSTRAINT domains_rps_check CHECK (((rps >= (0.01)::double precision) AND (rps <= (10000)::double precision)))
)
WITH (fillfactor='50');

--
-- Name: domain_tokens(scraping.domains, double precision, timestamp with time zone); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.domain_tokens(p_domain scraping.domains, p_rps double precision, p_now timestamp with time zone) RETURNS double precision
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT CASE
        WHEN p_domain.tokens IS NULL THEN greatest(1.0, p_rps)
        ELSE least(greatest(1.0, p_rps),
                   p_domain.tokens + p_rps * greatest(
                       0.0, extract(epoch FROM p_now - p_domain.tokens_at)))
    END
$$;

--
-- Name: domains_deleted(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.domains_deleted() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    DELETE FROM scraping.domain_queues q WHERE q.domain = OLD.domain;
    DELETE FROM scraping.tenant_flows f WHERE f.domain = OLD.domain;
    IF EXISTS (SELECT 1 FROM scraping.jobs j
               WHERE j.domain = OLD.domain AND j.status = 'queued') THEN
        INSERT INTO scraping.domains (domain) VALUES (OLD.domain)
        ON CONFLICT (domain) DO NOTHING;
        INSERT INTO scraping.domain_queues (domain, priority, head_tag)
        SELECT j.domain, j.priority, min(j.fair_tag) FROM scraping.jobs j
        WHERE j.domain = OLD.domain AND j.status = 'queued'
        GROUP BY j.domain, j.priority
        ON CONFLICT (domain, priority) DO NOTHING;
        INSERT INTO scraping.tenant_flows (domain, priority, tenant_id, head_tag)
        SELECT j.domain, j.priority, j.tenant_id, min(j.fair_tag) FROM scraping.jobs j
        WHERE j.domain = OLD.domain AND j.status = 'queued'
        GROUP BY j.domain, j.priority, j.tenant_id
        ON CONFLICT (domain, priority, tenant_id) DO NOTHING;
        INSERT INTO scraping.tenant_queues AS t (priority, tenant_id, start_tag)
        SELECT DISTINCT j.priority, j.tenant_id, c.start_clock FROM scraping.jobs j
        JOIN scraping.class_clocks c ON c.priority = j.priority
        WHERE j.domain = OLD.domain AND j.status = 'queued'
        ON CONFLICT (priority, tenant_id) DO UPDATE
        SET ready = true, start_tag = greatest(t.start_tag, EXCLUDED.start_tag)
        WHERE NOT t.ready;
    END IF;
    RETURN NULL;
END
$$;

--
-- Name: domains_domain_queue(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.domains_domain_queue() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
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
$$;

--
-- Name: domains_effective_rps(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.domains_effective_rps() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.configured_rps IS NULL AND NEW.crawl_delay IS NULL THEN
        -- a row inserted with its rate (older callers, tests): that rate is the operator's
        NEW.configured_rps := NEW.rps;
        RETURN NEW;
    END IF;
    NEW.rps := CASE
        WHEN NEW.crawl_delay > 0 THEN
            least(coalesce(NEW.configured_rps, NEW.robots_default_rps),
                  greatest(1.0 / (NEW.crawl_delay * 1.1), 0.01))
        ELSE NEW.configured_rps
    END;
    RETURN NEW;
END
$$;

--
-- Name: domains_pause_cause(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.domains_pause_cause() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.blocked_until IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.blocked_until IS DISTINCT FROM OLD.blocked_until) THEN
        NEW.pause_cause := coalesce(
            nullif(current_setting('pin.scraping_pause_cause', true), ''), 'retry_after');
    END IF;
    RETURN NEW;
END
$$;

--
-- Name: drop_empty_domain_queue(text, text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.drop_empty_domain_queue(p_domain text, p_priority text) RETURNS void
    LANGUAGE sql
    AS $$
    DELETE FROM scraping.domain_queues q
    WHERE q.ctid = (
        SELECT q2.ctid FROM scraping.domain_queues q2
        WHERE q2.domain = p_domain AND q2.priority = p_priority
          AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                          WHERE f.domain = p_domain AND f.priority = p_priority)
        FOR UPDATE SKIP LOCKED);
$$;

--
-- Name: idna_host(text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.idna_host(p_host text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $_$
DECLARE
    v_host text := lower(rtrim(btrim(p_host), '.'));
    v_labels text[];
    v_out text[] := '{}';
    v_label text;
    cps integer[];
    n integer; delta bigint; bias integer; h integer; b integer; m integer;
    q bigint; k integer; t integer; v_enc text;
    first boolean;
BEGIN
    IF v_host LIKE '[%]' THEN
        v_host := substr(v_host, 2, length(v_host) - 2);
    END IF;
    IF position(':' IN v_host) > 0 THEN
        BEGIN
            RETURN scraping.ipv6_key(v_host);
        EXCEPTION WHEN invalid_text_representation THEN
            RETURN v_host;
        END;
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' THEN
        RETURN v_host;
    END IF;
    v_labels := string_to_array(normalize(v_host, NFKC), '.');
    FOREACH v_label IN ARRAY v_labels LOOP
        IF v_label ~ '^[\x01-\x7f]*$' THEN
            v_out := v_out || v_label;
            CONTINUE;
        END IF;
        SELECT array_agg(ascii(c) ORDER BY o) INTO cps
        FROM unnest(string_to_array(v_label, NULL)) WITH ORDINALITY AS u(c, o);
        v_enc := '';
        FOR i IN 1..array_length(cps, 1) LOOP
            IF cps[i] < 128 THEN v_enc := v_enc || chr(cps[i]); END IF;
        END LOOP;
        b := length(v_enc);
        h := b;
        IF b > 0 THEN v_enc := v_enc || '-'; END IF;
        n := 128; delta := 0; bias := 72; first := true;
        WHILE h < array_length(cps, 1) LOOP
            SELECT min(c) INTO m FROM unnest(cps) AS c WHERE c >= n;
            delta := delta + (m - n)::bigint * (h + 1);
            n := m;
            FOR i IN 1..array_length(cps, 1) LOOP
                IF cps[i] < n THEN delta := delta + 1; END IF;
                IF cps[i] = n THEN
                    q := delta;
                    k := 36;
                    LOOP
                        t := CASE WHEN k <= bias THEN 1 WHEN k >= bias + 26 THEN 26
                                  ELSE k - bias END;
                        EXIT WHEN q < t;
                        v_enc := v_enc || scraping.punycode_digit((t + (q - t) % (36 - t))::integer);
                        q := (q - t) / (36 - t);
                        k := k + 36;
                    END LOOP;
                    v_enc := v_enc || scraping.punycode_digit(q::integer);
                    -- adapt the bias (RFC 3492 §6.1)
                    delta := CASE WHEN first THEN delta / 700 ELSE delta / 2 END;
                    delta := delta + delta / (h + 1);
                    k := 0;
                    WHILE delta > 455 LOOP
                        delta := delta / 35;
                        k := k + 36;
                    END LOOP;
                    bias := k + (36 * delta) / (delta + 38);
                    delta := 0;
                    first := false;
                    h := h + 1;
                END IF;
            END LOOP;
            delta := delta + 1;
            n := n + 1;
        END LOOP;
        v_out := v_out || ('xn--' || v_enc);
    END LOOP;
    RETURN array_to_string(v_out, '.');
END
$_$;

--
-- Name: ipv6_key(text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.ipv6_key(p_address text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE STRICT
    AS $_$
DECLARE
    v_inet inet := CAST(p_address AS inet);
    v text;
    m text[];
    g text[];
    v_tail text[];
    v_run integer := 0;
    v_start integer := 0;
    v_best integer := 0;
    v_best_start integer := 0;
BEGIN
    IF family(v_inet) <> 6 OR masklen(v_inet) <> 128 THEN
        RAISE EXCEPTION 'not an IPv6 address: %', quote_literal(left(p_address, 80))
            USING ERRCODE = '22P02';
    END IF;
    v := host(v_inet);
    m := regexp_match(v, '^::ffff:([0-9]+\.[0-9]+\.[0-9]+\.[0-9]+)$');
    IF m IS NOT NULL THEN
        RETURN m[1];
    END IF;
    m := regexp_match(v, '^(.*:)([0-9]+)\.([0-9]+)\.([0-9]+)\.([0-9]+)$');
    IF m IS NOT NULL THEN
        v := m[1] || to_hex(m[2]::integer * 256 + m[3]::integer) || ':'
            || to_hex(m[4]::integer * 256 + m[5]::integer);
    END IF;
    IF position('::' IN v) > 0 THEN
        g := CASE WHEN split_part(v, '::', 1) = '' THEN '{}'::text[]
                  ELSE string_to_array(split_part(v, '::', 1), ':') END;
        v_tail := CASE WHEN split_part(v, '::', 2) = '' THEN '{}'::text[]
                       ELSE string_to_array(split_part(v, '::', 2), ':') END;
        g := g || array_fill('0'::text, ARRAY[8 - cardinality(g) - cardinality(v_tail)])
            || v_tail;
    ELSE
        g := string_to_array(v, ':');
    END IF;
    FOR i IN 1..8 LOOP
        g[i] := to_hex(('x' || lpad(g[i], 8, '0'))::bit(32)::integer);
        IF g[i] = '0' THEN
            IF v_run = 0 THEN
                v_start := i;
            END IF;
            v_run := v_run + 1;
            IF v_run > v_best THEN
                v_best := v_run;
                v_best_start := v_start;
            END IF;
        ELSE
            v_run := 0;
        END IF;
    END LOOP;
    IF v_best < 2 THEN
        RETURN array_to_string(g, ':');
    END IF;
    RETURN array_to_string(g[1:v_best_start - 1], ':') || '::'
        || array_to_string(g[v_best_start + v_best:8], ':');
END
$_$;

--
-- Name: job_url_host(text, text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.job_url_host(p_url text, p_argument text) RETURNS text
    LANGUAGE plpgsql IMMUTABLE
    AS $_$
DECLARE
    v_bad text;
    v_parts text[];
    v_authority text;
    v_hostport text[];
    v_host text;
    v_port text;
BEGIN
    IF p_url IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', p_argument USING ERRCODE = '22023';
    END IF;
    IF length(p_url) > 2048 THEN
        RAISE EXCEPTION '% is longer than 2048 characters', p_argument USING ERRCODE = '22023';
    END IF;
    v_bad := substring(
        p_url FROM '[\x01-\x20\x7f-\x9f\u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]');
    IF v_bad IS NOT NULL THEN
        RAISE EXCEPTION '% must not contain whitespace or control characters (found U+%): '
            'percent-encode it', p_argument, upper(lpad(to_hex(ascii(v_bad)), 4, '0'))
            USING ERRCODE = '22023';
    END IF;
    v_parts := regexp_match(p_url, '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)');
    IF v_parts IS NULL THEN
        RAISE EXCEPTION '% must be an http:// or https:// URL (got %)',
            p_argument, quote_literal(left(p_url, 80))
            USING ERRCODE = '22023';
    END IF;
    v_authority := v_parts[1];
    IF position('@' IN v_authority) > 0 THEN
        RAISE EXCEPTION '%: credentials in a URL are not accepted (remove the '
            'user:password@ part)', p_argument
            USING ERRCODE = '22023';
    END IF;
    IF position(E'\\' IN v_authority) > 0 THEN
        RAISE EXCEPTION '% has a backslash in its host: write / or percent-encode it',
            p_argument USING ERRCODE = '22023';
    END IF;
    v_hostport := regexp_match(v_authority, '^(\[[0-9A-Fa-f:]*\]|[^:\[\]]*)(?::([0-9]*))?$');
    IF v_hostport IS NULL THEN
        RAISE EXCEPTION '% has an invalid host or port: %', p_argument,
            quote_literal(left(v_authority, 80))
            USING ERRCODE = '22023';
    END IF;
    v_host := v_hostport[1];
    v_port := v_hostport[2];
    IF v_port <> '' AND (length(v_port) > 5 OR v_port::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION '% has an invalid port %: give 1 to 65535', p_argument,
            quote_literal(v_port)
            USING ERRCODE = '22023';
    END IF;
    IF v_host IN ('', '[]') THEN
        RAISE EXCEPTION '% has no host', p_argument USING ERRCODE = '22023';
    END IF;
    IF left(v_host, 1) = '[' THEN
        v_host := substr(v_host, 2, length(v_host) - 2);
        BEGIN
            IF family(v_host::inet) = 6 THEN
                RETURN scraping.ipv6_key(v_host);
            END IF;
        EXCEPTION WHEN invalid_text_representation THEN
            NULL;
        END;
        RAISE EXCEPTION '% has an invalid IPv6 address %', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    IF v_host ~ '^[A-Za-z0-9_-]{1,63}(\.[A-Za-z0-9_-]{1,63})*\.?$' THEN
        -- An IPv4 address in another spelling than a.b.c.d (getaddrinfo reads 0x7f.1 as
        -- 127.0.0.1): one address under many keys gets many rates.
        IF v_host ~ '^(0[xX][0-9A-Fa-f]*|[0-9]+)(\.(0[xX][0-9A-Fa-f]*|[0-9]+)){0,3}\.?$'
           AND v_host !~ ('^((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}'
                          '(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.?$') THEN
            RAISE EXCEPTION '% has an IPv4 address not written as a.b.c.d (%): give four '
                'decimal numbers 0 to 255 without leading zeros', p_argument,
                quote_literal(left(v_host, 80))
                USING ERRCODE = '22023';
        END IF;
        RETURN rtrim(lower(v_host COLLATE "C"), '.');
    END IF;
    IF v_host ~ '^[\x01-\x7f]*$' THEN
        RAISE EXCEPTION '% has a host that is not a valid name (%): use letters, digits, '
            '''-'', ''_'' and dots, at most 63 characters between dots', p_argument,
            quote_literal(left(v_host, 80))
            USING ERRCODE = '22023';
    END IF;
    RAISE EXCEPTION '% has a host with non-ASCII characters (%): give it in its IDNA '
        'ASCII form (xn--..., as Python''s idna.encode writes it); POST /jobs takes either',
        p_argument, quote_literal(left(v_host, 80))
        USING ERRCODE = '22023';
END
$_$;

--
-- Name: jobs_domain_queue(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.jobs_domain_queue() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    IF NEW.status = 'queued' AND OLD.status <> 'queued' THEN
        PERFORM scraping.announce_queued_jobs(
            NEW.domain, NEW.priority, NEW.tenant_id, NEW.fair_tag, NEW.next_attempt_at);
    END IF;
    IF OLD.status = 'running' AND NEW.status <> 'running' THEN
        PERFORM scraping.wake_room_flows(OLD.domain);
    END IF;
    RETURN NULL;
END
$$;

--
-- Name: jobs_fair_tag(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.jobs_fair_tag() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    SELECT t.fair_tag INTO NEW.fair_tag
    FROM scraping.take_fair_tags(NEW.tenant_id, NEW.priority, 1) t;
    RETURN NEW;
END
$$;

--
-- Name: jobs_inserted_domain_queues(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.jobs_inserted_domain_queues() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM scraping.announce_queued_jobs(
        a.domain, a.priority, a.tenant_id, a.head_tag, a.due_at)
    FROM (SELECT n.domain, n.priority, n.tenant_id, min(n.fair_tag) AS head_tag,
                 min(n.next_attempt_at) AS due_at
          FROM new_jobs n
          WHERE n.status = 'queued'
          GROUP BY n.domain, n.priority, n.tenant_id
          ORDER BY n.domain, n.priority, n.tenant_id) a;
    RETURN NULL;
END
$$;

--
-- Name: lock_domain_rows(text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.lock_domain_rows(p_host text) RETURNS void
    LANGUAGE plpgsql
    AS $$
BEGIN
    PERFORM 1 FROM scraping.domain_queues q WHERE q.domain = p_host
    ORDER BY q.priority FOR NO KEY UPDATE;
    PERFORM 1 FROM scraping.tenant_flows f WHERE f.domain = p_host
    ORDER BY f.priority, f.tenant_id FOR NO KEY UPDATE;
END
$$;

--
-- Name: notify_job_finished(); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.notify_job_finished() RETURNS trigger
    LANGUAGE plpgsql
    AS $$
        BEGIN
            PERFORM pg_notify('scraping_job_finished', json_build_object('job_id', NEW.id, 'tenant_id', NEW.tenant_id, 'status', NEW.status, 'updated_at', NEW.updated_at)::text);
            RETURN NULL;
        END
        $$;

--
-- Name: pause_domain(text, timestamp with time zone); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.pause_domain(p_domain text, p_until timestamp with time zone) RETURNS timestamp with time zone
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_cap double precision := coalesce(
        nullif(current_setting('pin.scraping_max_pause_seconds', true), '')::double precision,
        3600);
    v_until timestamptz;
    v_kept timestamptz;
    v_host text;
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    IF p_until IS NULL OR p_until <= clock_timestamp() THEN
        SELECT d.blocked_until INTO v_kept FROM scraping.domains d
        WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until > clock_timestamp();
        RETURN v_kept;
    END IF;
    v_until := least(p_until, clock_timestamp() + make_interval(secs => v_cap));
    v_host := scraping.idna_host(p_domain);
    -- A pause that lengthens sets the host's queues and flows aside (its trigger), so it
    -- takes them first, in key order (scraping.lock_domain_rows). A pause that would change
    -- nothing locks nothing more: read under KEY SHARE, which waits for a resume under way
    -- (FOR UPDATE) and reads what it left (read past it, the pause was taken for no change,
    -- its trigger then took the rows in its own order).
    PERFORM 1 FROM scraping.domains d
    WHERE d.domain = v_host AND d.blocked_until >= v_until
    FOR KEY SHARE;
    IF NOT FOUND THEN
        PERFORM scraping.lock_domain_rows(v_host);
    END IF;
    INSERT INTO scraping.domains AS d (domain, blocked_until)
    VALUES (v_host, v_until)
    ON CONFLICT (domain) DO UPDATE
    SET blocked_until = greatest(coalesce(d.blocked_until, '-infinity'), EXCLUDED.blocked_until),
        updated_at = now()
    RETURNING d.blocked_until INTO v_kept;
    RETURN v_kept;
END
$$;

--
-- Name: punycode_digit(integer); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.punycode_digit(p_digit integer) RETURNS text
    LANGUAGE sql IMMUTABLE STRICT
    AS $$
    SELECT CASE WHEN p_digit < 26 THEN chr(97 + p_digit) ELSE chr(22 + p_digit) END;
$$;

--
-- Name: release_redirect_slot(uuid, integer); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.release_redirect_slot(p_job_id uuid, p_attempt integer) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_domain_name text;
BEGIN
    DELETE FROM scraping.redirect_slots s
    WHERE s.job_id = p_job_id AND s.attempt = p_attempt
    RETURNING s.domain INTO v_domain_name;
    IF v_domain_name IS NOT NULL THEN
        PERFORM scraping.wake_room_flows(v_domain_name);
    END IF;
END
$$;

--
-- Name: request_sha256(text, jsonb, text, text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.request_sha256(p_url text, p_params jsonb, p_priority text, p_callback_url text) RETURNS text
    LANGUAGE sql IMMUTABLE
    AS $$
    SELECT encode(sha256(convert_to(jsonb_build_object(
        'url', p_url, 'params', p_params, 'priority', p_priority,
        'callback_url', p_callback_url)::text, 'UTF8')), 'hex');
$$;

--
-- Name: resume_domain(text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.resume_domain(p_domain text) RETURNS boolean
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_was_paused boolean;
    v_host text;
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    -- Its trigger wakes the host's queues and flows: taken first, in key order, as a pause
    -- takes them (a resume holding the host's row deadlocked with a pause holding them).
    v_host := scraping.idna_host(p_domain);
    PERFORM scraping.lock_domain_rows(v_host);
    SELECT d.blocked_until > clock_timestamp() INTO v_was_paused FROM scraping.domains d
    WHERE d.domain = v_host AND d.blocked_until IS NOT NULL
    FOR UPDATE;
    UPDATE scraping.domains d SET blocked_until = NULL, updated_at = now()
    WHERE d.domain = v_host AND d.blocked_until IS NOT NULL;
    RETURN coalesce(v_was_paused, false);
END
$$;

--
-- Name: set_domain_flows_aside(text, text, uuid, timestamp with time zone, double precision); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.set_domain_flows_aside(p_domain text, p_priority text, p_first uuid, p_until timestamp with time zone, p_apart double precision) RETURNS TABLE(tenant_id uuid)
    LANGUAGE sql
    AS $$
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
$$;

--
-- Name: set_domain_queue_aside(text, text, text, timestamp with time zone); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.set_domain_queue_aside(p_domain text, p_priority text, p_waiting_for text, p_until timestamp with time zone) RETURNS void
    LANGUAGE sql
    AS $$
    UPDATE scraping.domain_queues q
    SET ready = false, waiting_for = p_waiting_for, wake_at = p_until
    WHERE q.domain = p_domain AND q.priority = p_priority;
$$;

--
-- Name: submit_job(uuid, text, jsonb, text, text, text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.submit_job(p_tenant_id uuid, p_url text, p_params jsonb DEFAULT '{}'::jsonb, p_priority text DEFAULT 'normal'::text, p_callback_url text DEFAULT NULL::text, p_idempotency_key text DEFAULT NULL::text) RETURNS uuid
    LANGUAGE plpgsql SECURITY DEFINER
    SET search_path TO 'pg_catalog', 'pg_temp'
    AS $$
-- Validates as POST /jobs does (SQLSTATE 22023, the message naming the argument), keys
-- the domain as the fetcher resolves the host (scraping.job_url_host), inserts the job
-- (its fair tag, queue, flow and tenant row come from the triggers of domain_queues.sql).
-- Same key and same body: the first job's id; same key, other body: SQLSTATE 23505 naming
-- the key. A key is remembered 24 hours (the API's documented TTL).
DECLARE
    v_domain text;
    v_digest text;
    v_id uuid;
    v_existing record;
BEGIN
    IF p_tenant_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM scraping.tenants t WHERE t.id = p_tenant_id) THEN
        RAISE EXCEPTION 'p_tenant_id: no tenant %', coalesce(p_tenant_id::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'pin tenant list shows the tenants';
    END IF;
    v_domain := scraping.job_url_host(p_url, 'p_url');
    IF p_callback_url IS NOT NULL THEN
        PERFORM scraping.job_url_host(p_callback_url, 'p_callback_url');
    END IF;
    IF p_params IS NULL OR jsonb_typeof(p_params) <> 'object' THEN
        RAISE EXCEPTION 'p_params must be a JSON object (got %)',
            coalesce(jsonb_typeof(p_params), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_priority IS NULL OR p_priority NOT IN ('high', 'normal', 'low') THEN
        RAISE EXCEPTION 'p_priority must be high, normal or low (got %)',
            coalesce(quote_literal(p_priority), 'NULL')
            USING ERRCODE = '22023';
    END IF;
    IF p_idempotency_key IS NOT NULL
       AND (length(p_idempotency_key) NOT BETWEEN 1 AND 255) THEN
        RAISE EXCEPTION 'p_idempotency_key must be 1 to 255 characters (got %)',
            length(p_idempotency_key)
            USING ERRCODE = '22023';
    END IF;
    v_digest := scraping.request_sha256(p_url, p_params, p_priority, p_callback_url);

    IF p_idempotency_key IS NOT NULL THEN
        UPDATE scraping.jobs j SET idempotency_key = NULL
        WHERE j.tenant_id = p_tenant_id AND j.idempotency_key = p_idempotency_key
          AND j.created_at < now() - interval '24 hours';
    END IF;
    INSERT INTO scraping.jobs AS j (
        id, tenant_id, url, domain, params, priority, callback_url, idempotency_key,
        request_sha256
    )
    VALUES (
        pin.uuid7(), p_tenant_id, p_url, v_domain, p_params,
        p_priority, p_callback_url, p_idempotency_key, v_digest
    )
    ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
    RETURNING j.id INTO v_id;
    IF v_id IS NOT NULL THEN
        RETURN v_id;
    END IF;
    -- The key's first job (a concurrent insert of it has committed by now).
    SELECT j.id, j.request_sha256 INTO v_existing FROM scraping.jobs j
    WHERE j.tenant_id = p_tenant_id AND j.idempotency_key = p_idempotency_key;
    IF v_existing.request_sha256 IS DISTINCT FROM v_digest THEN
        RAISE EXCEPTION 'p_idempotency_key % was already used with a different request',
            quote_literal(p_idempotency_key)
            USING ERRCODE = '23505', HINT = 'use a new key for a new job';
    END IF;
    RETURN v_existing.id;
END
$$;

--
-- Name: take_fair_tags(uuid, text, integer); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.take_fair_tags(p_tenant_id uuid, p_priority text, p_count integer) RETURNS TABLE(k integer, fair_tag double precision)
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_step double precision;
    v_clock double precision;
    v_first double precision;
BEGIN
    SELECT 1.0 / t.weight INTO v_step FROM scraping.tenants t WHERE t.id = p_tenant_id;
    SELECT c.tenant_clock INTO v_clock FROM scraping.class_clocks c
    WHERE c.priority = p_priority;
    INSERT INTO scraping.tenant_vtimes AS v (priority, tenant_id, vtime)
    VALUES (p_priority, p_tenant_id, v_clock + p_count * v_step)
    ON CONFLICT (priority, tenant_id) DO UPDATE
    SET vtime = greatest(v.vtime, v_clock) + p_count * v_step
    RETURNING v.vtime - p_count * v_step INTO v_first;
    RETURN QUERY SELECT g, v_first + g * v_step FROM generate_series(0, p_count - 1) AS g;
END
$$;

--
-- Name: take_redirect_slot(uuid, integer, text, double precision, double precision, integer); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.take_redirect_slot(p_job_id uuid, p_attempt integer, p_host text, p_hold_seconds double precision, p_default_rps double precision, p_default_concurrency integer) RETURNS double precision
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_domain_name text := scraping.idna_host(p_host);
    v_domain scraping.domains;
    v_now timestamptz;
    v_rps double precision;
    v_tokens double precision;
    v_running integer;
    v_own boolean;
BEGIN
    PERFORM scraping.release_redirect_slot(p_job_id, p_attempt);
    v_own := EXISTS (SELECT 1 FROM scraping.jobs j
                     WHERE j.id = p_job_id AND j.domain = v_domain_name);
    INSERT INTO scraping.domains (domain) VALUES (v_domain_name)
    ON CONFLICT (domain) DO NOTHING;
    SELECT d.* INTO v_domain FROM scraping.domains d
    WHERE d.domain = v_domain_name
    FOR UPDATE;
    v_now := clock_timestamp();

    IF v_domain.blocked_until > v_now THEN
        RETURN extract(epoch FROM v_domain.blocked_until - v_now);
    END IF;
    v_rps := coalesce(v_domain.rps, p_default_rps);
    v_tokens := scraping.domain_tokens(v_domain, v_rps, v_now);
    IF v_tokens < 1 THEN
        RETURN (1 - v_tokens) / v_rps;
    END IF;
    IF NOT v_own THEN
        SELECT (SELECT count(*) FROM scraping.jobs j
                WHERE j.status = 'running' AND j.domain = v_domain_name)
             + (SELECT count(*) FROM scraping.redirect_slots s
                WHERE s.domain = v_domain_name AND s.expires_at > v_now)
        INTO v_running;
        IF v_running >= coalesce(v_domain.concurrency, p_default_concurrency) THEN
            -- A job or hop finishing frees it; nothing tells a waiting hop: it asks again.
            RETURN 0.05;
        END IF;
    END IF;

    UPDATE scraping.domains d
    SET tokens = v_tokens - 1, tokens_at = greatest(v_now, d.tokens_at)
    WHERE d.domain = v_domain_name;
    IF NOT v_own THEN
        INSERT INTO scraping.redirect_slots (job_id, attempt, domain, expires_at)
        VALUES (p_job_id, p_attempt, v_domain_name,
                v_now + make_interval(secs => p_hold_seconds));
    END IF;
    RETURN 0;
END
$$;

--
-- Name: wake_room_flows(text); Type: FUNCTION; Schema: scraping; Owner: -
--

CREATE FUNCTION scraping.wake_room_flows(p_domain text) RETURNS void
    LANGUAGE plpgsql
    AS $$
DECLARE
    v_now timestamptz;
BEGIN
    PERFORM 1 FROM scraping.domains d WHERE d.domain = p_domain FOR KEY SHARE;
    v_now := clock_timestamp();
    IF EXISTS (SELECT 1 FROM scraping.domains d
               WHERE d.domain = p_domain AND d.blocked_until > v_now) THEN
        RETURN;
    END IF;
    UPDATE scraping.tenant_flows f SET wake_at = v_now
    WHERE f.ctid = ANY (ARRAY(
        SELECT w.ctid FROM scraping.tenant_flows w
        WHERE w.domain = p_domain AND w.waiting_for = 'room' AND w.wake_at > v_now
        ORDER BY w.wake_at
        LIMIT 4
        FOR UPDATE SKIP LOCKED
    ));
END
$$;

--
-- Name: buildings; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.buildings (
    id uuid NOT NULL,
    project_id uuid NOT NULL,
    name text,
    deleted_at timestamp with time zone,
    property_objects_total_count integer DEFAULT 0 NOT NULL,
    property_objects_free_count integer DEFAULT 0 NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: event_outbox; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.event_outbox (
    id bigint NOT NULL,
    topic text NOT NULL,
    entity character varying(32) NOT NULL,
    entity_id uuid NOT NULL,
    tenant_id uuid,
    version bigint NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    published_at timestamp with time zone,
    publish_attempts integer DEFAULT 0 NOT NULL,
    last_error character varying(1024)
);

--
-- Name: event_outbox_id_seq; Type: SEQUENCE; Schema: chessboard; Owner: -
--

CREATE SEQUENCE chessboard.event_outbox_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: event_outbox_id_seq; Type: SEQUENCE OWNED BY; Schema: chessboard; Owner: -
--

ALTER SEQUENCE chessboard.event_outbox_id_seq OWNED BY chessboard.event_outbox.id;

--
-- Name: layout_groups; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.layout_groups (
    id uuid NOT NULL,
    project_id uuid NOT NULL,
    name text,
    deleted_at timestamp with time zone,
    layouts_count integer DEFAULT 0 NOT NULL,
    area_min numeric(12,2),
    area_max numeric(12,2),
    version bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: layouts; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.layouts (
    id uuid NOT NULL,
    project_id uuid NOT NULL,
    layout_group_id uuid,
    name text,
    total_area numeric(12,2),
    deleted_at timestamp with time zone,
    property_objects_count integer DEFAULT 0 NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: project_recalc_requests; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.project_recalc_requests (
    project_id uuid NOT NULL,
    tenant_id uuid NOT NULL,
    due_at timestamp with time zone NOT NULL,
    first_requested_at timestamp with time zone NOT NULL,
    requested_count integer DEFAULT 1 NOT NULL,
    last_reason character varying(32) NOT NULL,
    attempt_count integer DEFAULT 0 NOT NULL,
    last_error character varying(1024),
    created_at timestamp with time zone NOT NULL,
    updated_at timestamp with time zone NOT NULL,
    not_before timestamp with time zone,
    claimed_until timestamp with time zone,
    claim_token uuid,
    claimable_at timestamp with time zone GENERATED ALWAYS AS (GREATEST(due_at, not_before, claimed_until)) STORED,
    CONSTRAINT project_recalc_requests_attempt_count_check CHECK ((attempt_count >= 0)),
    CONSTRAINT project_recalc_requests_requested_count_check CHECK ((requested_count >= 1))
);

--
-- Name: projects; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.projects (
    id uuid NOT NULL,
    tenant_id uuid,
    name text,
    status character varying(16) DEFAULT 'Draft'::character varying NOT NULL,
    deleted_at timestamp with time zone,
    price_min numeric(18,2),
    price_max numeric(18,2),
    property_objects_total_count integer DEFAULT 0 NOT NULL,
    property_objects_free_count integer DEFAULT 0 NOT NULL,
    version bigint DEFAULT 1 NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT projects_status_check CHECK (((status)::text = ANY ((ARRAY['Draft'::character varying, 'Published'::character varying, 'Hidden'::character varying, 'Archived'::character varying])::text[])))
);

--
-- Name: property_objects; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.property_objects (
    id uuid NOT NULL,
    project_id uuid NOT NULL,
    building_id uuid,
    layout_id uuid,
    status character varying(16) NOT NULL,
    price numeric(18,2),
    deleted_at timestamp with time zone,
    number text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: recalc_metrics; Type: TABLE; Schema: chessboard; Owner: -
--

CREATE TABLE chessboard.recalc_metrics (
    name text NOT NULL,
    label text DEFAULT ''::text NOT NULL,
    value double precision DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: comment_reconcile_owed; Type: TABLE; Schema: news; Owner: -
--

CREATE TABLE news.comment_reconcile_owed (
    post_id uuid NOT NULL,
    reason text NOT NULL,
    owed_since timestamp with time zone DEFAULT now() NOT NULL,
    run_id text,
    CONSTRAINT comment_reconcile_owed_reason_check CHECK ((reason = ANY (ARRAY['skipped'::text, 'lock_held'::text])))
);

--
-- Name: comment_reconcile_run_totals; Type: TABLE; Schema: news; Owner: -
--

CREATE TABLE news.comment_reconcile_run_totals (
    run_ref bigint NOT NULL,
    post_status text NOT NULL,
    posts_corrected bigint NOT NULL,
    comments_count_change bigint NOT NULL
);

--
-- Name: comment_reconcile_runs; Type: TABLE; Schema: news; Owner: -
--

CREATE TABLE news.comment_reconcile_runs (
    id bigint NOT NULL,
    run_id text NOT NULL,
    partition text,
    scope text NOT NULL,
    status text DEFAULT 'running'::text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    posts_reconciled bigint DEFAULT 0 NOT NULL,
    drift_corrected bigint DEFAULT 0 NOT NULL,
    posts_skipped bigint DEFAULT 0 NOT NULL,
    corrections jsonb DEFAULT '[]'::jsonb NOT NULL,
    by_status_recorded boolean DEFAULT true NOT NULL,
    CONSTRAINT comment_reconcile_runs_status_check CHECK ((status = ANY (ARRAY['running'::text, 'succeeded'::text, 'skipped'::text, 'cancelled'::text, 'failed'::text, 'retired'::text])))
);

--
-- Name: comment_reconcile_runs_id_seq; Type: SEQUENCE; Schema: news; Owner: -
--

ALTER TABLE news.comment_reconcile_runs ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME news.comment_reconcile_runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: comments; Type: TABLE; Schema: news; Owner: -
--

CREATE TABLE news.comments (
    id uuid NOT NULL,
    post_id uuid NOT NULL,
    status text DEFAULT 'Visible'::text NOT NULL,
    author_id uuid,
    body text,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT comments_status_check CHECK ((status = ANY (ARRAY['Visible'::text, 'HiddenByModerator'::text, 'DeletedByAuthor'::text])))
);

--
-- Name: posts; Type: TABLE; Schema: news; Owner: -
--

CREATE TABLE news.posts (
    id uuid NOT NULL,
    status text DEFAULT 'Draft'::text NOT NULL,
    comments_count integer DEFAULT 0 NOT NULL,
    title text,
    author_id uuid,
    comments_enabled boolean DEFAULT true NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT posts_status_check CHECK ((status = ANY (ARRAY['Draft'::text, 'Published'::text, 'Unpublished'::text, 'Archived'::text])))
);

--
-- Name: snapshot_detach_outbox; Type: TABLE; Schema: news; Owner: -
--

CREATE TABLE news.snapshot_detach_outbox (
    id uuid NOT NULL,
    snapshot_id uuid NOT NULL,
    post_id uuid NOT NULL,
    reason character varying(16) NOT NULL,
    attempts integer DEFAULT 0 NOT NULL,
    next_attempt_at timestamp with time zone DEFAULT now() NOT NULL,
    status character varying(16) DEFAULT 'Pending'::character varying NOT NULL,
    last_error character varying(512),
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT snapshot_detach_outbox_attempts_check CHECK ((attempts >= 0)),
    CONSTRAINT snapshot_detach_outbox_reason_check CHECK (((reason)::text = ANY ((ARRAY['BlockReplaced'::character varying, 'PostDeleted'::character varying])::text[]))),
    CONSTRAINT snapshot_detach_outbox_status_check CHECK (((status)::text = ANY ((ARRAY['Pending'::character varying, 'Done'::character varying, 'Quarantined'::character varying])::text[])))
);

--
-- Name: alembic_version; Type: TABLE; Schema: pin; Owner: -
--

CREATE TABLE pin.alembic_version (
    version_num character varying(32) NOT NULL
);

--
-- Name: distributed_locks; Type: TABLE; Schema: pin; Owner: -
--

CREATE TABLE pin.distributed_locks (
    lock_key text NOT NULL,
    holder text NOT NULL,
    acquired_at timestamp with time zone DEFAULT now() NOT NULL,
    expires_at timestamp with time zone NOT NULL,
    token uuid DEFAULT gen_random_uuid() NOT NULL
);

--
-- Name: job_checkpoints; Type: TABLE; Schema: pin; Owner: -
--

CREATE TABLE pin.job_checkpoints (
    checkpoint_key text NOT NULL,
    last_id uuid,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    window_start timestamp with time zone,
    window_end timestamp with time zone
);

--
-- Name: job_runs; Type: TABLE; Schema: pin; Owner: -
--

CREATE TABLE pin.job_runs (
    id bigint NOT NULL,
    job_code text NOT NULL,
    run_id text NOT NULL,
    status text NOT NULL,
    started_at timestamp with time zone NOT NULL,
    finished_at timestamp with time zone DEFAULT now() NOT NULL,
    result jsonb DEFAULT '{}'::jsonb NOT NULL,
    CONSTRAINT job_runs_status_check CHECK ((status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'skipped'::text, 'cancelled'::text])))
);

--
-- Name: job_runs_id_seq; Type: SEQUENCE; Schema: pin; Owner: -
--

CREATE SEQUENCE pin.job_runs_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1;

--
-- Name: job_runs_id_seq; Type: SEQUENCE OWNED BY; Schema: pin; Owner: -
--

ALTER SEQUENCE pin.job_runs_id_seq OWNED BY pin.job_runs.id;

--
-- Name: retired_totals; Type: TABLE; Schema: pin; Owner: -
--

CREATE TABLE pin.retired_totals (
    counter text NOT NULL,
    label text DEFAULT ''::text NOT NULL,
    value double precision DEFAULT 0 NOT NULL,
    updated_at timestamp with time zone DEFAULT now() NOT NULL
);

--
-- Name: pick_class_clocks; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.pick_class_clocks (
    slot smallint NOT NULL,
    tenant_clock double precision[] NOT NULL,
    exact_start_clock numeric[] NOT NULL,
    CONSTRAINT pick_class_clocks_check CHECK (((cardinality(tenant_clock) = 3) AND (cardinality(exact_start_clock) = 3))),
    CONSTRAINT pick_class_clocks_slot_check CHECK (((slot >= 0) AND (slot <= 7)))
);

--
-- Name: class_clocks; Type: VIEW; Schema: scraping; Owner: -
--

CREATE VIEW scraping.class_clocks AS
 SELECT c.priority,
    max(s.tenant_clock[c.k]) AS tenant_clock,
    max(s.exact_start_clock[c.k]) AS start_clock
   FROM (unnest(ARRAY['high'::text, 'normal'::text, 'low'::text]) WITH ORDINALITY c(priority, k)
     CROSS JOIN scraping.pick_class_clocks s)
  GROUP BY c.priority;

--
-- Name: domain_queues; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.domain_queues (
    domain text NOT NULL,
    priority text NOT NULL,
    head_tag double precision NOT NULL,
    ready boolean DEFAULT true NOT NULL,
    waiting_for text,
    wake_at timestamp with time zone,
    CONSTRAINT domain_queues_check CHECK (((ready = (waiting_for IS NULL)) AND (ready = (wake_at IS NULL)))),
    CONSTRAINT domain_queues_waiting_for_check CHECK ((waiting_for = ANY (ARRAY['room'::text, 'due'::text])))
)
WITH (fillfactor='70');

--
-- Name: intake_buckets; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.intake_buckets (
    tenant_id uuid NOT NULL,
    tokens double precision NOT NULL,
    refilled_at timestamp with time zone NOT NULL
)
WITH (fillfactor='50');

--
-- Name: job_attempts; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.job_attempts (
    job_id uuid NOT NULL,
    number integer NOT NULL,
    worker text NOT NULL,
    started_at timestamp with time zone DEFAULT now() NOT NULL,
    finished_at timestamp with time zone,
    outcome text,
    http_status integer,
    error_class text,
    error_detail text,
    duration_ms integer,
    CONSTRAINT job_attempts_error_detail_check CHECK ((length(error_detail) <= 512)),
    CONSTRAINT job_attempts_outcome_check CHECK ((outcome = ANY (ARRAY['succeeded'::text, 'retry'::text, 'failed'::text, 'lost'::text, 'cancelled'::text])))
);

--
-- Name: pick_classes; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.pick_classes (
    priority text NOT NULL,
    share integer NOT NULL,
    vtime bigint DEFAULT 0 NOT NULL,
    last_start bigint DEFAULT 0 NOT NULL,
    CONSTRAINT pick_classes_priority_check CHECK ((priority = ANY (ARRAY['high'::text, 'normal'::text, 'low'::text]))),
    CONSTRAINT pick_classes_share_check CHECK (((share > 0) AND ((60 % share) = 0)))
);

--
-- Name: redirect_slots; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.redirect_slots (
    job_id uuid NOT NULL,
    attempt integer NOT NULL,
    domain text NOT NULL,
    expires_at timestamp with time zone NOT NULL
);

--
-- Name: robots; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.robots (
    origin text NOT NULL,
    domain text NOT NULL,
    state text,
    http_status integer,
    body text,
    crawl_delay double precision,
    fetched_at timestamp with time zone,
    expires_at timestamp with time zone,
    failures integer DEFAULT 0 NOT NULL,
    last_error text,
    lease_owner text,
    lease_job uuid,
    lease_expires_at timestamp with time zone,
    updated_at timestamp with time zone DEFAULT now() NOT NULL,
    CONSTRAINT robots_state_check CHECK ((state = ANY (ARRAY['rules'::text, 'allow_all'::text, 'unreachable'::text])))
);

--
-- Name: tenant_flows; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.tenant_flows (
    domain text NOT NULL,
    priority text NOT NULL,
    tenant_id uuid NOT NULL,
    head_tag double precision NOT NULL,
    ready boolean DEFAULT true NOT NULL,
    waiting_for text,
    wake_at timestamp with time zone,
    CONSTRAINT tenant_flows_check CHECK (((ready = (waiting_for IS NULL)) AND (ready = (wake_at IS NULL)))),
    CONSTRAINT tenant_flows_waiting_for_check CHECK ((waiting_for = ANY (ARRAY['room'::text, 'due'::text])))
)
WITH (fillfactor='70');

--
-- Name: tenant_queues; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.tenant_queues (
    priority text NOT NULL,
    tenant_id uuid NOT NULL,
    start_tag numeric NOT NULL,
    ready boolean DEFAULT true NOT NULL
)
WITH (fillfactor='70');

--
-- Name: tenant_vtimes; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.tenant_vtimes (
    priority text NOT NULL,
    tenant_id uuid NOT NULL,
    vtime double precision NOT NULL
);

--
-- Name: tenants; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.tenants (
    id uuid NOT NULL,
    name text NOT NULL,
    api_key_sha256 bytea NOT NULL,
    api_key_prefix text NOT NULL,
    key_rotated_at timestamp with time zone DEFAULT now() NOT NULL,
    created_at timestamp with time zone DEFAULT now() NOT NULL,
    weight double precision DEFAULT 1 NOT NULL,
    webhook_secret text DEFAULT ('whsec_'::text || encode((uuid_send(gen_random_uuid()) || uuid_send(gen_random_uuid())), 'base64'::text)) NOT NULL,
    webhook_secret_rotated_at timestamp with time zone DEFAULT now() NOT NULL,
    webhook_secret_previous text,
    CONSTRAINT tenants_name_check CHECK ((name ~ '^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$'::text)),
    CONSTRAINT tenants_weight_check CHECK (((weight >= (0.001)::double precision) AND (weight <= (1000)::double precision)))
);

--
-- Name: webhook_deliveries; Type: TABLE; Schema: scraping; Owner: -
--

CREATE TABLE scraping.webhook_deliveries (
    id bigint NOT NULL,
    job_id uuid NOT NULL,
    number integer NOT NULL,
    job_status text NOT NULL,
    attempted_at timestamp with time zone DEFAULT now() NOT NULL,
    url text NOT NULL,
    outcome text NOT NULL,
    http_status integer,
    error_class text,
    error_detail text,
    duration_ms integer NOT NULL,
    next_attempt_at timestamp with time zone,
    CONSTRAINT webhook_deliveries_error_detail_check CHECK ((length(error_detail) <= 512)),
    CONSTRAINT webhook_deliveries_outcome_check CHECK ((outcome = ANY (ARRAY['delivered'::text, 'retry'::text, 'gave_up'::text])))
);

--
-- Name: webhook_deliveries_id_seq; Type: SEQUENCE; Schema: scraping; Owner: -
--

ALTER TABLE scraping.webhook_deliveries ALTER COLUMN id ADD GENERATED ALWAYS AS IDENTITY (
    SEQUENCE NAME scraping.webhook_deliveries_id_seq
    START WITH 1
    INCREMENT BY 1
    NO MINVALUE
    NO MAXVALUE
    CACHE 1
);

--
-- Name: event_outbox id; Type: DEFAULT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.event_outbox ALTER COLUMN id SET DEFAULT nextval('chessboard.event_outbox_id_seq'::regclass);

--
-- Name: job_runs id; Type: DEFAULT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.job_runs ALTER COLUMN id SET DEFAULT nextval('pin.job_runs_id_seq'::regclass);

--
-- Name: buildings buildings_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.buildings
    ADD CONSTRAINT buildings_pkey PRIMARY KEY (id);

--
-- Name: event_outbox event_outbox_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.event_outbox
    ADD CONSTRAINT event_outbox_pkey PRIMARY KEY (id);

--
-- Name: layout_groups layout_groups_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.layout_groups
    ADD CONSTRAINT layout_groups_pkey PRIMARY KEY (id);

--
-- Name: layouts layouts_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.layouts
    ADD CONSTRAINT layouts_pkey PRIMARY KEY (id);

--
-- Name: project_recalc_requests project_recalc_requests_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.project_recalc_requests
    ADD CONSTRAINT project_recalc_requests_pkey PRIMARY KEY (project_id);

--
-- Name: projects projects_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.projects
    ADD CONSTRAINT projects_pkey PRIMARY KEY (id);

--
-- Name: property_objects property_objects_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.property_objects
    ADD CONSTRAINT property_objects_pkey PRIMARY KEY (id);

--
-- Name: recalc_metrics recalc_metrics_pkey; Type: CONSTRAINT; Schema: chessboard; Owner: -
--

ALTER TABLE ONLY chessboard.recalc_metrics
    ADD CONSTRAINT recalc_metrics_pkey PRIMARY KEY (name, label);

--
-- Name: comment_reconcile_owed comment_reconcile_owed_pkey; Type: CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.comment_reconcile_owed
    ADD CONSTRAINT comment_reconcile_owed_pkey PRIMARY KEY (post_id);

--
-- Name: comment_reconcile_run_totals comment_reconcile_run_totals_pkey; Type: CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.comment_reconcile_run_totals
    ADD CONSTRAINT comment_reconcile_run_totals_pkey PRIMARY KEY (run_ref, post_status);

--
-- Name: comment_reconcile_runs comment_reconcile_runs_pkey; Type: CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.comment_reconcile_runs
    ADD CONSTRAINT comment_reconcile_runs_pkey PRIMARY KEY (id);

--
-- Name: comments comments_pkey; Type: CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.comments
    ADD CONSTRAINT comments_pkey PRIMARY KEY (id);

--
-- Name: posts posts_pkey; Type: CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.posts
    ADD CONSTRAINT posts_pkey PRIMARY KEY (id);

--
-- Name: snapshot_detach_outbox snapshot_detach_outbox_pkey; Type: CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.snapshot_detach_outbox
    ADD CONSTRAINT snapshot_detach_outbox_pkey PRIMARY KEY (id);

--
-- Name: alembic_version alembic_version_pkc; Type: CONSTRAINT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.alembic_version
    ADD CONSTRAINT alembic_version_pkc PRIMARY KEY (version_num);

--
-- Name: distributed_locks distributed_locks_pkey; Type: CONSTRAINT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.distributed_locks
    ADD CONSTRAINT distributed_locks_pkey PRIMARY KEY (lock_key);

--
-- Name: distributed_locks distributed_locks_token_key; Type: CONSTRAINT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.distributed_locks
    ADD CONSTRAINT distributed_locks_token_key UNIQUE (token);

--
-- Name: job_checkpoints job_checkpoints_pkey; Type: CONSTRAINT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.job_checkpoints
    ADD CONSTRAINT job_checkpoints_pkey PRIMARY KEY (checkpoint_key);

--
-- Name: job_runs job_runs_pkey; Type: CONSTRAINT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.job_runs
    ADD CONSTRAINT job_runs_pkey PRIMARY KEY (id);

--
-- Name: retired_totals retired_totals_pkey; Type: CONSTRAINT; Schema: pin; Owner: -
--

ALTER TABLE ONLY pin.retired_totals
    ADD CONSTRAINT retired_totals_pkey PRIMARY KEY (counter, label);

--
-- Name: domain_queues domain_queues_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.domain_queues
    ADD CONSTRAINT domain_queues_pkey PRIMARY KEY (domain, priority);

--
-- Name: domains domains_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.domains
    ADD CONSTRAINT domains_pkey PRIMARY KEY (domain);

--
-- Name: intake_buckets intake_buckets_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.intake_buckets
    ADD CONSTRAINT intake_buckets_pkey PRIMARY KEY (tenant_id);

--
-- Name: job_attempts job_attempts_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.job_attempts
    ADD CONSTRAINT job_attempts_pkey PRIMARY KEY (job_id, number);

--
-- Name: jobs jobs_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.jobs
    ADD CONSTRAINT jobs_pkey PRIMARY KEY (id);

--
-- Name: pick_class_clocks pick_class_clocks_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.pick_class_clocks
    ADD CONSTRAINT pick_class_clocks_pkey PRIMARY KEY (slot);

--
-- Name: pick_classes pick_classes_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.pick_classes
    ADD CONSTRAINT pick_classes_pkey PRIMARY KEY (priority);

--
-- Name: redirect_slots redirect_slots_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.redirect_slots
    ADD CONSTRAINT redirect_slots_pkey PRIMARY KEY (job_id, attempt);

--
-- Name: robots robots_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.robots
    ADD CONSTRAINT robots_pkey PRIMARY KEY (origin);

--
-- Name: tenant_flows tenant_flows_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_flows
    ADD CONSTRAINT tenant_flows_pkey PRIMARY KEY (domain, priority, tenant_id);

--
-- Name: tenant_queues tenant_queues_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_queues
    ADD CONSTRAINT tenant_queues_pkey PRIMARY KEY (priority, tenant_id);

--
-- Name: tenant_vtimes tenant_vtimes_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_vtimes
    ADD CONSTRAINT tenant_vtimes_pkey PRIMARY KEY (priority, tenant_id);

--
-- Name: tenants tenants_api_key_sha256_key; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenants
    ADD CONSTRAINT tenants_api_key_sha256_key UNIQUE (api_key_sha256);

--
-- Name: tenants tenants_name_key; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenants
    ADD CONSTRAINT tenants_name_key UNIQUE (name);

--
-- Name: tenants tenants_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenants
    ADD CONSTRAINT tenants_pkey PRIMARY KEY (id);

--
-- Name: webhook_deliveries webhook_deliveries_pkey; Type: CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_pkey PRIMARY KEY (id);

--
-- Name: ix_buildings_project; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_buildings_project ON chessboard.buildings USING btree (project_id);

--
-- Name: ix_event_outbox_published; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_event_outbox_published ON chessboard.event_outbox USING btree (published_at) WHERE (published_at IS NOT NULL);

--
-- Name: ix_event_outbox_unpublished; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_event_outbox_unpublished ON chessboard.event_outbox USING btree (id) WHERE (published_at IS NULL);

--
-- Name: ix_layout_groups_project; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_layout_groups_project ON chessboard.layout_groups USING btree (project_id);

--
-- Name: ix_layouts_project; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_layouts_project ON chessboard.layouts USING btree (project_id) INCLUDE (layout_group_id, total_area, deleted_at);

--
-- Name: ix_project_recalc_claimable; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_project_recalc_claimable ON chessboard.project_recalc_requests USING btree (claimable_at);

--
-- Name: ix_property_objects_project_live; Type: INDEX; Schema: chessboard; Owner: -
--

CREATE INDEX ix_property_objects_project_live ON chessboard.property_objects USING btree (project_id) INCLUDE (building_id, layout_id, status, price) WHERE (deleted_at IS NULL);

--
-- Name: ix_comment_reconcile_runs_partition; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_comment_reconcile_runs_partition ON news.comment_reconcile_runs USING btree (partition);

--
-- Name: ix_comments_created_at; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_comments_created_at ON news.comments USING btree (created_at);

--
-- Name: ix_comments_post_visible; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_comments_post_visible ON news.comments USING btree (post_id) WHERE (status = 'Visible'::text);

--
-- Name: ix_comments_updated_at; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_comments_updated_at ON news.comments USING btree (updated_at);

--
-- Name: ix_sdo_done_updated; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_sdo_done_updated ON news.snapshot_detach_outbox USING btree (updated_at) WHERE ((status)::text = 'Done'::text);

--
-- Name: ix_sdo_due; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_sdo_due ON news.snapshot_detach_outbox USING btree (status, next_attempt_at);

--
-- Name: ix_sdo_post; Type: INDEX; Schema: news; Owner: -
--

CREATE INDEX ix_sdo_post ON news.snapshot_detach_outbox USING btree (post_id);

--
-- Name: ux_sdo_snapshot; Type: INDEX; Schema: news; Owner: -
--

CREATE UNIQUE INDEX ux_sdo_snapshot ON news.snapshot_detach_outbox USING btree (snapshot_id) WHERE ((status)::text <> 'Done'::text);

--
-- Name: ix_job_runs_finished; Type: INDEX; Schema: pin; Owner: -
--

CREATE INDEX ix_job_runs_finished ON pin.job_runs USING btree (finished_at);

--
-- Name: ix_job_runs_job_finished; Type: INDEX; Schema: pin; Owner: -
--

CREATE INDEX ix_job_runs_job_finished ON pin.job_runs USING btree (job_code, finished_at DESC);

--
-- Name: ix_domain_queues_pick; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_domain_queues_pick ON scraping.domain_queues USING btree (priority, head_tag, domain) WHERE ready;

--
-- Name: ix_domain_queues_wake; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_domain_queues_wake ON scraping.domain_queues USING btree (wake_at) WHERE (NOT ready);

--
-- Name: ix_domains_blocked; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_domains_blocked ON scraping.domains USING btree (blocked_until) WHERE (blocked_until IS NOT NULL);

--
-- Name: ix_domains_overrides; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_domains_overrides ON scraping.domains USING btree (domain) WHERE ((rps IS NOT NULL) OR (concurrency IS NOT NULL));

--
-- Name: ix_job_attempts_finished; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_job_attempts_finished ON scraping.job_attempts USING btree (finished_at) WHERE (finished_at IS NOT NULL);

--
-- Name: ix_jobs_attempt_objects_unswept; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_attempt_objects_unswept ON scraping.jobs USING btree (finished_at, id) WHERE ((attempt_objects_swept_at IS NULL) AND (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text])));

--
-- Name: ix_jobs_domain_head; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_domain_head ON scraping.jobs USING btree (domain, priority, fair_tag, id) WHERE (status = 'queued'::text);

--
-- Name: ix_jobs_due; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_due ON scraping.jobs USING btree (next_attempt_at, id) WHERE (status = 'queued'::text);

--
-- Name: ix_jobs_flow_head; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_flow_head ON scraping.jobs USING btree (domain, priority, tenant_id, fair_tag, id) WHERE (status = 'queued'::text);

--
-- Name: ix_jobs_lease; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_lease ON scraping.jobs USING btree (lease_expires_at) WHERE ((status = 'running'::text) AND (lease_expires_at IS NOT NULL));

--
-- Name: ix_jobs_queued_domain; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_queued_domain ON scraping.jobs USING btree (domain, next_attempt_at) WHERE (status = 'queued'::text);

--
-- Name: ix_jobs_result_age; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_result_age ON scraping.jobs USING btree (finished_at, id) WHERE ((status = 'succeeded'::text) AND (result_expired_at IS NULL));

--
-- Name: ix_jobs_running_domain; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_running_domain ON scraping.jobs USING btree (domain) WHERE (status = 'running'::text);

--
-- Name: ix_jobs_tenant; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_tenant ON scraping.jobs USING btree (tenant_id, id);

--
-- Name: ix_jobs_tenant_status; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_tenant_status ON scraping.jobs USING btree (tenant_id, status, id);

--
-- Name: ix_jobs_webhook_due; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_jobs_webhook_due ON scraping.jobs USING btree (COALESCE(webhook_next_attempt_at, finished_at), id) WHERE ((callback_url IS NOT NULL) AND (finish_published_at IS NULL) AND (status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text])));

--
-- Name: ix_redirect_slots_domain; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_redirect_slots_domain ON scraping.redirect_slots USING btree (domain, expires_at);

--
-- Name: ix_robots_domain; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_robots_domain ON scraping.robots USING btree (domain);

--
-- Name: ix_tenant_flows_domain_ready; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_tenant_flows_domain_ready ON scraping.tenant_flows USING btree (domain, priority) WHERE ready;

--
-- Name: ix_tenant_flows_pick; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_tenant_flows_pick ON scraping.tenant_flows USING btree (priority, tenant_id, head_tag, domain) WHERE ready;

--
-- Name: ix_tenant_flows_room; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_tenant_flows_room ON scraping.tenant_flows USING btree (domain, wake_at) WHERE (waiting_for = 'room'::text);

--
-- Name: ix_tenant_flows_wake; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_tenant_flows_wake ON scraping.tenant_flows USING btree (wake_at) WHERE (NOT ready);

--
-- Name: ix_tenant_queues_pick; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_tenant_queues_pick ON scraping.tenant_queues USING btree (priority, start_tag, tenant_id) WHERE ready;

--
-- Name: ix_webhook_deliveries_job; Type: INDEX; Schema: scraping; Owner: -
--

CREATE INDEX ix_webhook_deliveries_job ON scraping.webhook_deliveries USING btree (job_id, id);

--
-- Name: ux_jobs_idempotency; Type: INDEX; Schema: scraping; Owner: -
--

CREATE UNIQUE INDEX ux_jobs_idempotency ON scraping.jobs USING btree (tenant_id, idempotency_key) WHERE (idempotency_key IS NOT NULL);

--
-- Name: domains domains_deleted; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER domains_deleted AFTER DELETE ON scraping.domains FOR EACH ROW EXECUTE FUNCTION scraping.domains_deleted();

--
-- Name: domains domains_domain_queue_insert; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER domains_domain_queue_insert AFTER INSERT ON scraping.domains FOR EACH ROW WHEN ((new.blocked_until IS NOT NULL)) EXECUTE FUNCTION scraping.domains_domain_queue();

--
-- Name: domains domains_domain_queue_update; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER domains_domain_queue_update AFTER UPDATE OF blocked_until, rps, concurrency ON scraping.domains FOR EACH ROW WHEN (((old.blocked_until IS DISTINCT FROM new.blocked_until) OR (old.rps IS DISTINCT FROM new.rps) OR (old.concurrency IS DISTINCT FROM new.concurrency))) EXECUTE FUNCTION scraping.domains_domain_queue();

--
-- Name: domains domains_effective_rps; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER domains_effective_rps BEFORE INSERT OR UPDATE OF configured_rps, crawl_delay, robots_default_rps ON scraping.domains FOR EACH ROW EXECUTE FUNCTION scraping.domains_effective_rps();

--
-- Name: domains domains_pause_cause; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER domains_pause_cause BEFORE INSERT OR UPDATE OF blocked_until ON scraping.domains FOR EACH ROW EXECUTE FUNCTION scraping.domains_pause_cause();

--
-- Name: jobs jobs_domain_queue_insert; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER jobs_domain_queue_insert AFTER INSERT ON scraping.jobs REFERENCING NEW TABLE AS new_jobs FOR EACH STATEMENT EXECUTE FUNCTION scraping.jobs_inserted_domain_queues();

--
-- Name: jobs jobs_domain_queue_update; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER jobs_domain_queue_update AFTER UPDATE OF status ON scraping.jobs FOR EACH ROW WHEN (((old.status IS DISTINCT FROM new.status) AND ((new.status = 'queued'::text) OR (old.status = 'running'::text)))) EXECUTE FUNCTION scraping.jobs_domain_queue();

--
-- Name: jobs jobs_fair_tag_insert; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER jobs_fair_tag_insert BEFORE INSERT ON scraping.jobs FOR EACH ROW WHEN (((new.status = 'queued'::text) AND (new.fair_tag IS NULL))) EXECUTE FUNCTION scraping.jobs_fair_tag();

--
-- Name: jobs jobs_fair_tag_requeue; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER jobs_fair_tag_requeue BEFORE UPDATE OF status ON scraping.jobs FOR EACH ROW WHEN (((new.status = 'queued'::text) AND (old.status <> 'queued'::text))) EXECUTE FUNCTION scraping.jobs_fair_tag();

--
-- Name: jobs jobs_notify_finished; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER jobs_notify_finished AFTER UPDATE OF status ON scraping.jobs FOR EACH ROW WHEN (((old.status IS DISTINCT FROM new.status) AND ((new.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text])) OR (old.status = ANY (ARRAY['succeeded'::text, 'failed'::text, 'cancelled'::text]))))) EXECUTE FUNCTION scraping.notify_job_finished();

--
-- Name: jobs jobs_updated_at_advances; Type: TRIGGER; Schema: scraping; Owner: -
--

CREATE TRIGGER jobs_updated_at_advances BEFORE UPDATE ON scraping.jobs FOR EACH ROW WHEN (((old.status IS DISTINCT FROM new.status) AND (new.updated_at <= old.updated_at))) EXECUTE FUNCTION scraping.advance_job_updated_at();

--
-- Name: comment_reconcile_run_totals comment_reconcile_run_totals_run_ref_fkey; Type: FK CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.comment_reconcile_run_totals
    ADD CONSTRAINT comment_reconcile_run_totals_run_ref_fkey FOREIGN KEY (run_ref) REFERENCES news.comment_reconcile_runs(id) ON DELETE CASCADE;

--
-- Name: comments comments_post_id_fkey; Type: FK CONSTRAINT; Schema: news; Owner: -
--

ALTER TABLE ONLY news.comments
    ADD CONSTRAINT comments_post_id_fkey FOREIGN KEY (post_id) REFERENCES news.posts(id);

--
-- Name: domain_queues domain_queues_priority_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.domain_queues
    ADD CONSTRAINT domain_queues_priority_fkey FOREIGN KEY (priority) REFERENCES scraping.pick_classes(priority);

--
-- Name: intake_buckets intake_buckets_tenant_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.intake_buckets
    ADD CONSTRAINT intake_buckets_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES scraping.tenants(id) ON DELETE CASCADE;

--
-- Name: job_attempts job_attempts_job_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.job_attempts
    ADD CONSTRAINT job_attempts_job_id_fkey FOREIGN KEY (job_id) REFERENCES scraping.jobs(id) ON DELETE CASCADE;

--
-- Name: jobs jobs_tenant_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.jobs
    ADD CONSTRAINT jobs_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES scraping.tenants(id);

--
-- Name: tenant_flows tenant_flows_priority_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_flows
    ADD CONSTRAINT tenant_flows_priority_fkey FOREIGN KEY (priority) REFERENCES scraping.pick_classes(priority);

--
-- Name: tenant_flows tenant_flows_tenant_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_flows
    ADD CONSTRAINT tenant_flows_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES scraping.tenants(id) ON DELETE CASCADE;

--
-- Name: tenant_queues tenant_queues_priority_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_queues
    ADD CONSTRAINT tenant_queues_priority_fkey FOREIGN KEY (priority) REFERENCES scraping.pick_classes(priority);

--
-- Name: tenant_queues tenant_queues_tenant_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_queues
    ADD CONSTRAINT tenant_queues_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES scraping.tenants(id) ON DELETE CASCADE;

--
-- Name: tenant_vtimes tenant_vtimes_priority_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_vtimes
    ADD CONSTRAINT tenant_vtimes_priority_fkey FOREIGN KEY (priority) REFERENCES scraping.pick_classes(priority);

--
-- Name: tenant_vtimes tenant_vtimes_tenant_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.tenant_vtimes
    ADD CONSTRAINT tenant_vtimes_tenant_id_fkey FOREIGN KEY (tenant_id) REFERENCES scraping.tenants(id) ON DELETE CASCADE;

--
-- Name: webhook_deliveries webhook_deliveries_job_id_fkey; Type: FK CONSTRAINT; Schema: scraping; Owner: -
--

ALTER TABLE ONLY scraping.webhook_deliveries
    ADD CONSTRAINT webhook_deliveries_job_id_fkey FOREIGN KEY (job_id) REFERENCES scraping.jobs(id) ON DELETE CASCADE;

--
-- PostgreSQL database dump complete
--
