-- The scheduler's state kept at write time: a job's fair tag (its place among its
-- tenant's jobs of its class), the (domain, class) queues, each tenant's flow per (domain,
-- class) and its row per class (scraping.tenant_queues: its start tag, parked or not), and
-- what sets a queue or flow aside or brings it back. Triggers on scraping.jobs and
-- scraping.domains keep it, so every writer (intake, the worker's outcomes, the sweeper,
-- the runbook requeue, an operator's SQL) keeps it right. The claim (claim_jobs.sql)
-- spends a tenant's turn when it starts one of its jobs, not here.

-- A job entering the queue takes its tenant's next fair tag in its class: the tenant's
-- last tag or the class's tag clock, whichever is later, then grown by 1/weight. It orders
-- the tenant's own jobs (oldest first, on each domain and across its flows); it does not
-- decide whose turn it is, so it stays double precision (the tenants' start tags, which
-- do, are numeric: claim_jobs.sql, migration 0046); past a tag clock of 2**44 a tenant's
-- new jobs may take equal tags and then go by id, and no other tenant's turn moves.
-- Concurrent intake of one tenant into one class serialises on its tenant_vtimes row,
-- nothing else.
--
-- scraping.take_fair_tags reserves p_count consecutive tags at once and returns them,
-- numbered from 0 (the k-th is first + k/weight): a batch pays one upsert per class, not
-- one per job. A job inserted with its tag given (insert_jobs) is left as it is; every
-- other insert, and every requeue, takes one tag here.
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
    SELECT c.tenant_clock INTO v_clock FROM scraping.class_clocks c
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

-- Jobs entering the queue are announced to their (domain, class) queue and to their
-- tenant's flow there: each made, its head lowered, or woken early when it waited for a
-- later due time; and the tenant's row in the class made, or brought back from parked when
-- its flow can be claimed now. p_head_tag and p_due_at are the smallest tag and due time
-- among the jobs announced together.
CREATE OR REPLACE FUNCTION scraping.announce_queued_jobs(
    p_domain text, p_priority text, p_tenant_id uuid, p_head_tag double precision,
    p_due_at timestamptz
) RETURNS void
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- After an INSERT statement: its queued jobs announced once per (domain, class, tenant),
-- in that order (two batches sharing domains lock their queues in the same order), so a
-- batch of 400 jobs on 50 domains makes 50 announcements, not 400.
CREATE OR REPLACE FUNCTION scraping.jobs_inserted_domain_queues() RETURNS trigger
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- A connection of the domain freed (a job left `running`, a redirect hop ended): the
-- first few of its flows set aside for want of room look again at the next claim (the
-- others at the next finish or their own wake time: a busy site shared by many tenants
-- costs a few rows per finish, not one per tenant). The domain's row is read under a KEY
-- SHARE lock: a claim holding it may be setting flows aside for want of a connection
-- this finish frees, so this waits for that claim and wakes what it set aside.
CREATE OR REPLACE FUNCTION scraping.wake_room_flows(p_domain text) RETURNS void
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- After a job's status changes: a job back in the queue (a retry, a requeue) is announced
-- to its queue and flow; a job leaving `running` frees a connection.
CREATE OR REPLACE FUNCTION scraping.jobs_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
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
$fn$;

-- A domain paused (a 429, an operator) sets its queues and flows aside until the pause
-- ends, and parks the tenants it leaves with nothing to claim (once per pause: a claim
-- then never meets them); a pause lifted or a limit changed
-- brings the flows waiting for room back at the next claim.
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

-- A domain's state row deleted (an operator resetting it): its queues and flows go with
-- it, and a fresh row, queues and flows are made again for the jobs still queued there, so
-- none is left out of the pick.
CREATE OR REPLACE FUNCTION scraping.domains_deleted() RETURNS trigger
LANGUAGE plpgsql AS $fn$
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
$fn$;
