-- 0039 down: the pick by domain queue head again, fair tags spent at intake.

-- The scheduler's write-time state (migration 0011): a job's fair tag, the (domain, class)
-- queues the claim picks from, and what sets a queue aside or brings it back. Triggers on
-- scraping.jobs and scraping.domains keep it, so every writer (intake, the worker's
-- outcomes, the sweeper, the runbook requeue, an operator's SQL) keeps it right.

-- A job entering the queue takes its tenant's next start tag in its class: the tenant's
-- last finish tag or the class clock (the largest tag picked), whichever is later; the
-- finish tag then grows by 1/weight. Concurrent intake of one tenant into one class
-- serialises on its tenant_vtimes row, nothing else.
--
-- scraping.take_fair_tags reserves p_count consecutive tags at once and returns them,
-- numbered from 0 (the k-th is first + k/weight): a batch pays one upsert per class, not
-- one per job (migration 0018). A job inserted with its tag given (insert_jobs) is left as
-- it is; every other insert, and every requeue, takes one tag here.
CREATE OR REPLACE FUNCTION scraping.take_fair_tags(
    p_tenant_id uuid, p_priority text, p_count integer
) RETURNS TABLE (k integer, fair_tag double precision)
LANGUAGE plpgsql AS $fn$
DECLARE
    v_step double precision;
    v_clock double precision;
    v_first double precision;
BEGIN
    SELECT 1.0 / t.weight INTO v_step FROM scraping.tenants t WHERE t.id = p_tenant_id;
    SELECT c.tenant_clock INTO v_clock FROM scraping.pick_classes c
    WHERE c.priority = p_priority;
    INSERT INTO scraping.tenant_vtimes AS v (priority, tenant_id, vtime)
    VALUES (p_priority, p_tenant_id, v_clock + p_count * v_step)
    ON CONFLICT (priority, tenant_id) DO UPDATE
    SET vtime = greatest(v.vtime, v_clock) + p_count * v_step
    RETURNING v.vtime - p_count * v_step INTO v_first;
    RETURN QUERY SELECT g, v_first + g * v_step FROM generate_series(0, p_count - 1) AS g;
END
$fn$;

CREATE OR REPLACE FUNCTION scraping.jobs_fair_tag() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    SELECT t.fair_tag INTO NEW.fair_tag
    FROM scraping.take_fair_tags(NEW.tenant_id, NEW.priority, 1) t;
    RETURN NEW;
END
$fn$;

-- A queue leaves the pick until `until`: 'room' (the domain paused, its bucket empty, its
-- connections full) or 'due' (no due job). Called with the queue's row locked.
CREATE OR REPLACE FUNCTION scraping.set_domain_queue_aside(
    p_domain text, p_priority text, p_waiting_for text, p_until timestamptz
) RETURNS void
LANGUAGE sql AS $fn$
    UPDATE scraping.domain_queues q
    SET ready = false, waiting_for = p_waiting_for, wake_at = p_until
    WHERE q.domain = p_domain AND q.priority = p_priority;
$fn$;

-- Jobs entering the queue are announced to their (domain, class) queue: made, its head
-- lowered, or woken early when it waited for a later due time. p_head_tag and p_due_at are
-- the smallest tag and due time among the jobs announced together.
CREATE OR REPLACE FUNCTION scraping.announce_queued_jobs(
    p_domain text, p_priority text, p_head_tag double precision, p_due_at timestamptz
) RETURNS void
LANGUAGE plpgsql AS $fn$
DECLARE
    v_blocked timestamptz;
BEGIN
    -- The common case writes nothing: a queue that already sorts at or before these jobs
    -- and is not waiting for a later due time. Read under a KEY SHARE lock: a claim
    -- holding the queue (FOR UPDATE) may be about to delete it (it took the last job it
    -- saw) or set it aside until a later due time, so this waits for that claim and reads
    -- what it left; read without the lock, the jobs were announced to a queue the claim
    -- then deleted, and were never claimed again (migration 0020).
    PERFORM 1 FROM scraping.domain_queues q
    WHERE q.domain = p_domain AND q.priority = p_priority
      AND q.head_tag <= p_head_tag
      AND (q.ready OR q.waiting_for = 'room' OR q.wake_at <= p_due_at)
    FOR KEY SHARE;
    IF FOUND THEN
        RETURN;
    END IF;
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
END
$fn$;

-- After an INSERT statement: its queued jobs announced once per (domain, class), in that
-- order (two batches sharing domains lock their queues in the same order), so a batch of
-- 400 jobs on 50 domains makes 50 announcements, not 400 (migration 0018).
CREATE OR REPLACE FUNCTION scraping.jobs_inserted_domain_queues() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    PERFORM scraping.announce_queued_jobs(a.domain, a.priority, a.head_tag, a.due_at)
    FROM (SELECT n.domain, n.priority, min(n.fair_tag) AS head_tag,
                 min(n.next_attempt_at) AS due_at
          FROM new_jobs n
          WHERE n.status = 'queued'
          GROUP BY n.domain, n.priority
          ORDER BY n.domain, n.priority) a;
    RETURN NULL;
END
$fn$;

-- After a job's status changes: a job back in the queue (a retry, a requeue) is announced
-- to its queue; a job leaving `running` frees a connection, so the domain's queues waiting
-- for room look again at the next claim.
CREATE OR REPLACE FUNCTION scraping.jobs_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.status = 'queued' AND OLD.status <> 'queued' THEN
        PERFORM scraping.announce_queued_jobs(
            NEW.domain, NEW.priority, NEW.fair_tag, NEW.next_attempt_at);
    END IF;
    IF OLD.status = 'running' AND NEW.status <> 'running' THEN
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = OLD.domain AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM scraping.domains d
                          WHERE d.domain = OLD.domain AND d.blocked_until > clock_timestamp());
    END IF;
    RETURN NULL;
END
$fn$;

-- A domain paused (a 429, an operator) sets its queues aside until the pause ends; a pause
-- lifted or a limit changed brings the queues waiting for room back at the next claim.
CREATE OR REPLACE FUNCTION scraping.domains_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.blocked_until > clock_timestamp() THEN
        UPDATE scraping.domain_queues q
        SET ready = false, waiting_for = 'room', wake_at = NEW.blocked_until
        WHERE q.domain = NEW.domain
          AND (q.ready OR q.wake_at IS DISTINCT FROM NEW.blocked_until);
    ELSE
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = NEW.domain AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp();
    END IF;
    RETURN NULL;
END
$fn$;

-- A domain's state row deleted (an operator resetting it): its queues go with it, and a
-- fresh row and queues are made again for the jobs still queued there, so none is left
-- out of the pick.
CREATE OR REPLACE FUNCTION scraping.domains_deleted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    DELETE FROM scraping.domain_queues q WHERE q.domain = OLD.domain;
    IF EXISTS (SELECT 1 FROM scraping.jobs j
               WHERE j.domain = OLD.domain AND j.status = 'queued') THEN
        INSERT INTO scraping.domains (domain) VALUES (OLD.domain)
        ON CONFLICT (domain) DO NOTHING;
        INSERT INTO scraping.domain_queues (domain, priority, head_tag)
        SELECT j.domain, j.priority, min(j.fair_tag) FROM scraping.jobs j
        WHERE j.domain = OLD.domain AND j.status = 'queued'
        GROUP BY j.domain, j.priority
        ON CONFLICT (domain, priority) DO NOTHING;
    END IF;
    RETURN NULL;
END
$fn$;

-- scraping.claim_jobs: the pick (README "Scheduling"; the design in migration 0011, the
-- per-pick statements cut in migration 0017).
--
-- Claim up to p_limit due jobs for worker p_worker: each gets a lease (from
-- clock_timestamp(), the moment it is claimed), its attempt counter and an attempt row.
-- Every pick goes priority class -> the (class, domain) queue with the smallest head tag
-- among domains with room -> that domain's due job with the smallest tag.
--
-- 1. Class: start-time fair queuing over the classes with shares 6:3:1, state in
--    scraping.pick_classes (as in 0007): with all three backlogged every window of ten picks
--    is exactly 6 high, 3 normal, 1 low; a class with nothing claimable is passed over and,
--    when it comes back, starts at the clock (no banked credit).
-- 2. Tenant: decided at write time. A job entering the queue takes its tenant's next start
--    tag in its class (trigger jobs_fair_tag: max(tenant's last finish, class clock), then
--    the tenant's finish grows by 1/weight). Picking the smallest tag is weighted fair
--    queuing by jobs started; an idle tenant comes back at the clock, i.e. first in line.
-- 3. Domain: scraping.domain_queues holds one row per (domain, class) with queued jobs,
--    its head tag, and whether the domain may have room (`ready`). A domain found without
--    room (paused, bucket empty, connections full) or without a due job is set aside with
--    the time to look again (`wake_at`), so it leaves the pick index until then: paused and
--    busy domains cost nothing per pick, however many there are.
--
-- Concurrency: no global lock. A claim locks the domain queue it picks from and the
-- domain's state row (scraping.domains: token bucket, pause) with FOR UPDATE SKIP LOCKED,
-- so claimers of different domains never wait for each other, and two claimers never both
-- spend a domain's last token or connection (connections are counted from the jobs
-- themselves under that row lock, so nothing can drift). It waits for a lock only while
-- it holds none (every domain with room is being claimed from: one busy site), so claims
-- never deadlock.
--
-- Statements per pick (0017, 0019; 0011 ran about eight): two, each with its generic plan.
-- (a) The probe: one statement finds the class's queue with the smallest head tag
--     (ix_domain_queues_pick), locks it, then its domain's row (both SKIP LOCKED: a queue
--     whose domain row another claim holds is left to that claim for the rest of this
--     call; since 0019 the queue first, so a queue passed over costs only its own row),
--     and counts the domain's connections (ix_jobs_running_domain, redirect slots). The same statement
--     writes the previous pick's queue change (its new head, set aside, or deleted) in a
--     data-modifying CTE; that queue is left out of the probe, and a ready one is compared
--     by its new head as a bound on the probe ((head_tag, domain) < bound), so the order
--     of picks is the one the separate writes gave.
--     The count is taken in the probe's snapshot, i.e. before the row lock: it is used
--     only when the domain row locked is the version that snapshot sees (ctid equal).
--     Every claim that makes a domain's jobs running writes that domain's row before it
--     commits (its token spend), so a claim that committed after the snapshot left a newer
--     row version, the lock lands on it, and the count is taken again after the lock.
-- (b) The head: the domain's due job with the smallest tag (locked, SKIP LOCKED) and, in
--     the same statement, the queue's next head tag (ix_jobs_domain_head).
-- A domain picked from is kept in the call's local state (its bucket, its connections,
-- its lock): picked again in this call it costs no more lookups. Its token spends are
-- written once, for every domain at the end (one set-based UPDATE; the rows stay locked
-- by this transaction until it ends). A cached domain whose connections look full is
-- counted again before it is set aside (a job may have finished meanwhile). At the end one
-- UPDATE claims the batch (each job's lease stamped with its pick's clock_timestamp())
-- and one INSERT writes its attempt rows. Nothing here grows with tenants, domains, paused
-- domains or queue depth.
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

CREATE OR REPLACE FUNCTION scraping.claim_jobs(
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS SETOF scraping.jobs
LANGUAGE plpgsql VOLATILE
-- Every statement here is an index probe whose plan does not depend on its values; left to
-- choose, PL/pgSQL planned the probe afresh at every pick (with no change to write, its
-- CTEs fold away and the custom plan looks cheaper than the generic one): ~1/3 of a claim.
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    c_name text[] := ARRAY['high', 'normal', 'low'];
    c_step bigint[];
    c_finish bigint[];
    c_start bigint[];
    c_tclock double precision[];
    c_done boolean[] := ARRAY[false, false, false];
    v_clock bigint;
    ci integer;
    n_picked integer := 0;
    v_now timestamptz;
    v_probe record;
    v_qdomain text;
    v_qhead double precision;
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
    k integer;
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
    -- the queue change not yet written (written by the next probe, or at the end)
    pq_domain text;
    pq_priority text;
    pq_delete boolean;
    pq_head double precision;
    pq_ready boolean;
    pq_waiting_for text;
    pq_wake_at timestamptz;
    -- the probe's exclusion and bound for the queue of that change
    v_excluded text;
    v_bound_head double precision;
    v_bound_domain text;
    -- whether this call holds a row lock yet: until it does, it may wait for one without
    -- any risk of a deadlock (a waiter holding nothing is in no cycle)
    v_holds_locks boolean := false;
    v_found boolean;
    -- domains whose state row another claim holds: left to it for the rest of this call
    v_domains_taken text[] := '{}';
    v_counted_now boolean;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;

    -- Domain queues whose wait is over come back into the pick (a bounded batch per call;
    -- rows another claim is waking are skipped, not waited for). The clock is read into a
    -- variable first: compared with clock_timestamp() itself (volatile) the wake time is
    -- no index bound, and the scan of ix_domain_queues_wake read every queue set aside.
    -- The rows are updated by their ctids (locked here, so they stay put): joined back by
    -- key, the generic plan hashed a sequential scan of every queue.
    v_now := clock_timestamp();
    UPDATE scraping.domain_queues q
    SET ready = true, wake_at = NULL, waiting_for = NULL
    WHERE q.ctid = ANY (ARRAY(
        SELECT w.ctid FROM scraping.domain_queues w
        WHERE NOT w.ready AND w.wake_at <= v_now
        ORDER BY w.wake_at
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
    ));
    v_holds_locks := FOUND;

    SELECT array_agg(60 / share ORDER BY array_position(c_name, priority)),
           array_agg(vtime ORDER BY array_position(c_name, priority)),
           array_agg(last_start ORDER BY array_position(c_name, priority)),
           array_agg(tenant_clock ORDER BY array_position(c_name, priority)),
           max(last_start)
    INTO c_step, c_finish, c_start, c_tclock, v_clock
    FROM scraping.pick_classes;

    <<picks>>
    WHILE n_picked < p_limit LOOP
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

        <<domains>>
        LOOP
            -- 2. the class's domain queue with the smallest head tag. The queue of the
            -- change not yet written is left out; when it is of this class and stays in
            -- the pick, it is the pick unless the probe finds a queue before its new head.
            v_excluded := '';
            v_bound_head := 'Infinity';
            v_bound_domain := '';
            IF pq_priority = c_name[ci] THEN
                v_excluded := pq_domain;
                IF pq_ready THEN
                    v_bound_head := pq_head;
                    v_bound_domain := pq_domain;
                END IF;
            END IF;
            WITH write_change AS (
                UPDATE scraping.domain_queues q
                SET head_tag = pq_head, ready = pq_ready, waiting_for = pq_waiting_for,
                    wake_at = pq_wake_at
                WHERE q.domain = pq_domain AND q.priority = pq_priority AND NOT pq_delete
            ), delete_queue AS (
                DELETE FROM scraping.domain_queues q
                WHERE q.domain = pq_domain AND q.priority = pq_priority AND pq_delete
            )
            -- The queue is locked first and its domain's row after it (LATERAL): a queue
            -- another claimer holds is passed over at the cost of its own row, and the
            -- connections are counted for the queue locked only. (Locked together in one
            -- join, 0017, every queue passed over cost a domains lookup and a count too,
            -- so each claimer more made every probe of the others dearer: 0019.) A queue
            -- whose domain row another claim holds (its other class) is left to it for
            -- the rest of this call.
            SELECT q1.domain, q1.head_tag, dd.domain IS NOT NULL AS domain_locked,
                   dd.tokens, dd.tokens_at, dd.blocked_until, dd.rps, dd.concurrency,
                   CASE WHEN dd.domain IS NOT NULL AND q1.domain <> ALL (dc_domain) THEN
                       (SELECT count(*) FROM scraping.jobs j
                        WHERE j.status = 'running' AND j.domain = q1.domain)
                       + (SELECT count(*) FROM scraping.redirect_slots s
                          WHERE s.domain = q1.domain AND s.expires_at > clock_timestamp())
                   END AS running,
                   dd.locked_ctid = (SELECT d2.ctid FROM scraping.domains d2
                                     WHERE d2.domain = q1.domain) AS counted_under_lock
            INTO v_probe
            FROM (
                SELECT q.domain, q.head_tag
                FROM scraping.domain_queues q
                WHERE q.priority = c_name[ci] AND q.ready AND q.domain <> v_excluded
                  AND q.domain <> ALL (v_domains_taken)
                  AND (q.head_tag, q.domain) < (v_bound_head, v_bound_domain)
                ORDER BY q.head_tag, q.domain
                LIMIT 1
                FOR UPDATE OF q SKIP LOCKED
            ) q1
            LEFT JOIN LATERAL (
                SELECT d.domain, d.tokens, d.tokens_at, d.blocked_until, d.rps,
                       d.concurrency, d.ctid AS locked_ctid
                FROM scraping.domains d
                WHERE d.domain = q1.domain
                FOR UPDATE SKIP LOCKED
            ) dd ON true;
            v_found := FOUND;
            -- the change is written
            pq_domain := NULL;
            pq_priority := NULL;
            IF v_found AND NOT v_probe.domain_locked THEN
                v_holds_locks := true;
                v_domains_taken := v_domains_taken || v_probe.domain;
                CONTINUE domains;
            ELSIF v_found THEN
                v_qdomain := v_probe.domain;
                v_qhead := v_probe.head_tag;
            ELSIF v_bound_domain <> '' THEN
                -- the queue just picked from is still the first: its row and its domain's
                -- are this call's already
                v_qdomain := v_bound_domain;
                v_qhead := v_bound_head;
            ELSIF NOT v_holds_locks THEN
                -- Every queue with room is being picked from by other claims (one busy
                -- site): wait for the first of them rather than answer "nothing to do",
                -- then probe again (its domain's row is still taken SKIP LOCKED).
                PERFORM 1 FROM scraping.domain_queues q
                WHERE q.priority = c_name[ci] AND q.ready
                ORDER BY q.head_tag, q.domain
                LIMIT 1
                FOR UPDATE;
                IF FOUND THEN
                    v_holds_locks := true;
                    CONTINUE domains;
                END IF;
                -- nothing of this class to wait for: it is done, and this claim may still
                -- wait for another class's queue
                c_done[ci] := true;
                CONTINUE picks;
            ELSE
                c_done[ci] := true;
                CONTINUE picks;
            END IF;
            v_holds_locks := true;
            v_now := clock_timestamp();

            k := array_position(dc_domain, v_qdomain);
            v_counted_now := k IS NULL;
            IF k IS NULL THEN
                IF v_probe.counted_under_lock IS NOT TRUE THEN
                    -- another claim committed on this domain after the probe's snapshot
                    SELECT (SELECT count(*) FROM scraping.jobs j
                            WHERE j.status = 'running' AND j.domain = v_qdomain)
                         + (SELECT count(*) FROM scraping.redirect_slots s
                            WHERE s.domain = v_qdomain AND s.expires_at > v_now)
                    INTO v_running;
                ELSE
                    v_running := v_probe.running;
                END IF;
                dc_domain := dc_domain || v_qdomain;
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

            -- 3. room: no pause, a token in the bucket, a free connection
            IF dc_blocked[k] > v_now THEN
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := false;
                pq_head := v_qhead;
                pq_ready := false;
                pq_waiting_for := 'room';
                pq_wake_at := dc_blocked[k];
                CONTINUE domains;
            END IF;
            v_rps := dc_rps[k];
            v_concurrency := dc_concurrency[k];
            v_domain.tokens := dc_tokens[k];
            v_domain.tokens_at := dc_tokens_at[k];
            v_tokens := scraping.domain_tokens(v_domain, v_rps, v_now);
            IF v_tokens < 1 THEN
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := false;
                pq_head := v_qhead;
                pq_ready := false;
                pq_waiting_for := 'room';
                pq_wake_at := v_now + make_interval(secs => (1 - v_tokens) / v_rps);
                CONTINUE domains;
            END IF;
            -- connections: its running jobs, this call's picks, and redirect hops of
            -- other domains' jobs to it (scraping.take_redirect_slot)
            IF NOT v_counted_now AND dc_running[k] + dc_picks[k] >= v_concurrency THEN
                -- counted when this call locked it: a job may have finished since
                SELECT (SELECT count(*) FROM scraping.jobs j
                        WHERE j.status = 'running' AND j.domain = v_qdomain)
                     + (SELECT count(*) FROM scraping.redirect_slots s
                        WHERE s.domain = v_qdomain AND s.expires_at > v_now)
                INTO v_running;
                dc_running[k] := v_running;
            END IF;
            v_running := dc_running[k] + dc_picks[k];
            IF v_running >= v_concurrency THEN
                -- A finishing job wakes it (trigger jobs_domain_queue); the second is a
                -- safety net for a finish that committed while this claim was deciding.
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := false;
                pq_head := v_qhead;
                pq_ready := false;
                pq_waiting_for := 'room';
                pq_wake_at := v_now + interval '1 second';
                CONTINUE domains;
            END IF;

            -- 4. the domain's due job with the smallest tag, never one asked to cancel, and
            -- the tag the queue's head has once it is picked
            SELECT h.id, h.fair_tag,
                   (SELECT j.fair_tag FROM scraping.jobs j
                    WHERE j.domain = v_qdomain AND j.priority = c_name[ci]
                      AND j.status = 'queued' AND j.id <> ALL (picked) AND j.id <> h.id
                    ORDER BY j.fair_tag, j.id
                    LIMIT 1)
            INTO v_job_id, v_tag, v_next
            FROM (
                SELECT j.id, j.fair_tag FROM scraping.jobs j
                WHERE j.domain = v_qdomain AND j.priority = c_name[ci]
                  AND j.status = 'queued' AND j.next_attempt_at <= v_now
                  AND j.cancel_requested_at IS NULL AND j.id <> ALL (picked)
                ORDER BY j.fair_tag, j.id
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            ) h;
            IF NOT FOUND THEN
                SELECT min(j.next_attempt_at) INTO v_due FROM scraping.jobs j
                WHERE j.domain = v_qdomain AND j.priority = c_name[ci]
                  AND j.status = 'queued' AND j.cancel_requested_at IS NULL
                  AND j.id <> ALL (picked);
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                IF v_due IS NULL THEN
                    pq_delete := true;
                    pq_ready := false;
                ELSE
                    -- Not due yet, or its due jobs held by another transaction (a cancel).
                    pq_delete := false;
                    pq_head := v_qhead;
                    pq_ready := false;
                    pq_waiting_for := 'due';
                    pq_wake_at := greatest(v_due, v_now + interval '1 second');
                END IF;
                CONTINUE domains;
            END IF;

            -- The pick: spend the domain's token and connection (written at the end),
            -- advance both clocks. The jobs are claimed together at the end, each stamped
            -- with its pick's moment.
            picked := picked || v_job_id;
            picked_at := picked_at || v_now;
            n_picked := n_picked + 1;
            v_tokens := v_tokens - 1;
            dc_tokens[k] := v_tokens;
            dc_tokens_at[k] := greatest(v_now, dc_tokens_at[k]);
            dc_picks[k] := dc_picks[k] + 1;

            IF v_next IS NULL THEN
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := true;
                pq_ready := false;
            ELSIF v_tokens < 1 THEN
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := false;
                pq_head := v_next;
                pq_ready := false;
                pq_waiting_for := 'room';
                pq_wake_at := v_now + make_interval(secs => (1 - v_tokens) / v_rps);
            ELSIF v_running + 1 >= v_concurrency THEN
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := false;
                pq_head := v_next;
                pq_ready := false;
                pq_waiting_for := 'room';
                pq_wake_at := v_now + interval '1 second';
            ELSIF v_next <> v_qhead THEN
                pq_domain := v_qdomain;
                pq_priority := c_name[ci];
                pq_delete := false;
                pq_head := v_next;
                pq_ready := true;
                pq_waiting_for := NULL;
                pq_wake_at := NULL;
            END IF;

            c_tclock[ci] := greatest(c_tclock[ci], v_tag);
            v_clock := greatest(c_finish[ci], v_clock);
            c_start[ci] := v_clock;
            c_finish[ci] := v_clock + c_step[ci];
            CONTINUE picks;
        END LOOP domains;
    END LOOP picks;

    -- the last queue change, and the token spends of every domain picked from
    IF pq_domain IS NOT NULL THEN
        IF pq_delete THEN
            DELETE FROM scraping.domain_queues q
            WHERE q.domain = pq_domain AND q.priority = pq_priority;
        ELSE
            UPDATE scraping.domain_queues q
            SET head_tag = pq_head, ready = pq_ready, waiting_for = pq_waiting_for,
                wake_at = pq_wake_at
            WHERE q.domain = pq_domain AND q.priority = pq_priority;
        END IF;
    END IF;
    IF n_picked = 0 THEN
        RETURN;
    END IF;
    UPDATE scraping.domains d
    SET tokens = u.tokens, tokens_at = greatest(u.tokens_at, d.tokens_at)
    FROM unnest(dc_domain, dc_tokens, dc_tokens_at, dc_picks)
        AS u(domain, tokens, tokens_at, picks)
    WHERE d.domain = u.domain AND u.picks > 0;

    -- The class state, unless another claim is writing it right now: then its write
    -- stands (both continued the sequence from the same state), and this claim never
    -- waits. All three rows or none, so the state stays one point of the sequence.
    PERFORM 1 FROM scraping.pick_classes FOR UPDATE SKIP LOCKED;
    GET DIAGNOSTICS n_locked = ROW_COUNT;
    IF n_locked = 3 THEN
        UPDATE scraping.pick_classes c
        SET vtime = c_finish[ck], last_start = c_start[ck],
            tenant_clock = greatest(c.tenant_clock, c_tclock[ck])
        FROM generate_subscripts(c_name, 1) AS ck
        WHERE c.priority = c_name[ck];
    END IF;

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
END
$fn$;

-- Redirect hops to another host (README "Scheduling"): a hop counts against the HOP
-- host's limits, shared by every worker, with the claim's rules (scraping.claim_jobs): no
-- pause, a token in the bucket, a free connection. A connection held by a hop is a row of
-- scraping.redirect_slots until the hop's fetch ends (at the latest p_hold_seconds, the
-- fetch deadline: a killed worker's slot lapses by itself), and the claim counts those
-- rows with the domain's running jobs.
--
-- scraping.take_redirect_slot: for attempt p_attempt of job p_job_id, about to follow a
-- redirect to host p_host. Gives back the job's slot of an earlier hop first (one hop at
-- a time). Returns 0 when the hop may go (a token spent, a connection held), else the
-- seconds to wait before asking again. Every hop is a request to its host and spends a
-- token of it, a hop back to the job's own domain too (five hops on the claim's one token
-- sent six requests in a second to a host of 1 rps); only the connection is the claim's
-- there, so such a hop holds no slot. It waits only for the domain's row lock and holds
-- no other.
CREATE OR REPLACE FUNCTION scraping.take_redirect_slot(
    p_job_id uuid,
    p_attempt integer,
    p_host text,
    p_hold_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS double precision
LANGUAGE plpgsql VOLATILE AS $fn$
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
$fn$;

-- The hop's fetch ended: its connection is free, so the domain's queues set aside for
-- want of one look again at the next claim (as a job leaving `running` does).
CREATE OR REPLACE FUNCTION scraping.release_redirect_slot(p_job_id uuid, p_attempt integer)
RETURNS void
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_domain_name text;
BEGIN
    DELETE FROM scraping.redirect_slots s
    WHERE s.job_id = p_job_id AND s.attempt = p_attempt
    RETURNING s.domain INTO v_domain_name;
    IF v_domain_name IS NOT NULL THEN
        UPDATE scraping.domain_queues q SET wake_at = clock_timestamp()
        WHERE q.domain = v_domain_name AND NOT q.ready AND q.waiting_for = 'room'
          AND q.wake_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM scraping.domains d
                          WHERE d.domain = v_domain_name AND d.blocked_until > clock_timestamp());
    END IF;
END
$fn$;

-- Intake from SQL (docs/integration.md): another service submits a job in its own
-- transaction (the job exists exactly when that transaction commits), one row or
-- set-based (`SELECT scraping.submit_job(t.id, u.url) FROM …`). The API's doors check a
-- job in Python (pin_orchestration/scraping/hosts.py) and insert it with queries.sql's
-- insert_jobs; scraping.job_url_host is hosts.check_url in SQL, held equal to it by
-- tests/scraping/test_intake_differential.py, but for one thing: a host with non-ASCII
-- characters is refused here (IDNA 2008 is the `idna` package's, not PostgreSQL's), its
-- ASCII (xn--) form accepted with the key POST /jobs gives the Unicode one.

-- One key per IPv6 address, whatever its spelling (hosts.ipv6_key, rule for rule): the
-- compressed form of RFC 5952 as Python's ipaddress writes it (lowercase hex, no leading
-- zeros, the first longest run of two or more zero groups as ::, no embedded dotted
-- quad), an IPv4-mapped address as the IPv4 address it reaches. PostgreSQL's inet
-- output is that but for its dotted tails (::ffff:127.0.0.1, ::1.2.3.4), rewritten here.
-- 22P02 for what is not an IPv6 address.
CREATE OR REPLACE FUNCTION scraping.ipv6_key(p_address text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
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
$fn$;

-- A host named by the worker (a pause, a redirect hop: ASCII, as requests sends it) as
-- the politeness limits key it: no trailing dot, lowercased, an IPv6 literal without
-- brackets in its one spelling (scraping.ipv6_key). (Its punycode of a non-ASCII name is not IDNA 2008's: intake no longer
-- uses it.)
CREATE OR REPLACE FUNCTION scraping.idna_host(p_host text) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT AS $fn$
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
$fn$;

CREATE OR REPLACE FUNCTION scraping.punycode_digit(p_digit integer) RETURNS text
LANGUAGE sql IMMUTABLE STRICT AS $fn$
    SELECT CASE WHEN p_digit < 26 THEN chr(97 + p_digit) ELSE chr(22 + p_digit) END;
$fn$;

-- The fingerprint of a request body: the same Idempotency-Key with another body is refused.
CREATE OR REPLACE FUNCTION scraping.request_sha256(
    p_url text, p_params jsonb, p_priority text, p_callback_url text
) RETURNS text
LANGUAGE sql IMMUTABLE AS $fn$
    SELECT encode(sha256(convert_to(jsonb_build_object(
        'url', p_url, 'params', p_params, 'priority', p_priority,
        'callback_url', p_callback_url)::text, 'UTF8')), 'hex');
$fn$;

CREATE OR REPLACE FUNCTION scraping.submit_job(
    p_tenant_id uuid,
    p_url text,
    p_params jsonb DEFAULT '{}',
    p_priority text DEFAULT 'normal',
    p_callback_url text DEFAULT NULL,
    p_idempotency_key text DEFAULT NULL
) RETURNS uuid
LANGUAGE plpgsql VOLATILE SECURITY DEFINER
SET search_path = pg_catalog, pg_temp AS $fn$
-- Validates as POST /jobs does (SQLSTATE 22023, the message naming the argument), keys
-- the domain as the fetcher resolves the host (scraping.job_url_host), inserts the job
-- (its fair tag and domain queue come from the triggers of migration 0011). Same key and
-- same body: the first job's id; same key, other body: SQLSTATE 23505 naming the key. A
-- key is remembered 24 hours (the API's documented TTL).
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
$fn$;

-- A job's URL or callback as POST /jobs accepts it (pin_orchestration/scraping/hosts.py,
-- check_url, rule for rule), and its host key: at most 2048 characters; no whitespace or
-- control character; http(s)://, then an authority without userinfo or backslash: a name
-- of letters, digits, '-', '_' and dots (lowercased, its trailing dot dropped) or an IPv6
-- literal in brackets (scraping.ipv6_key: one key per address); a port of 1 to 5 digits, 1 to 65535.
-- SQLSTATE 22023 naming p_argument otherwise.
CREATE OR REPLACE FUNCTION scraping.job_url_host(p_url text, p_argument text) RETURNS text
LANGUAGE plpgsql IMMUTABLE AS $fn$
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
$fn$;

DROP FUNCTION scraping.announce_queued_jobs(text, text, uuid, double precision, timestamptz);
DROP FUNCTION scraping.wake_room_flows(text);
DROP FUNCTION scraping.drop_empty_domain_queue(text, text);
DROP FUNCTION scraping.set_domain_flows_aside(text, text, uuid, timestamptz, double precision);
DROP INDEX scraping.ix_jobs_flow_head;
DROP TABLE scraping.tenant_flows;
DROP TABLE scraping.tenant_queues;
ALTER TABLE scraping.pick_classes DROP COLUMN start_clock;
