-- 0039: fair by jobs started, whatever is blocked. The claim picks the tenant whose turn
-- it is (scraping.tenant_queues: one row per class and tenant with queued jobs, its start
-- tag, parked or not), then one of its flows (scraping.tenant_flows: its jobs on one
-- domain of one class) whose domain has room, and spends the tenant's turn when it starts
-- the job; a tenant none of whose flows can be claimed is parked, its tag standing still.
-- Fair tags taken at intake now only order a tenant's own jobs.
ALTER TABLE scraping.pick_classes ADD COLUMN start_clock double precision NOT NULL DEFAULT 0;

CREATE TABLE scraping.tenant_queues (
    priority text NOT NULL REFERENCES scraping.pick_classes (priority),
    tenant_id uuid NOT NULL REFERENCES scraping.tenants (id) ON DELETE CASCADE,
    start_tag double precision NOT NULL,
    ready boolean NOT NULL DEFAULT true,
    PRIMARY KEY (priority, tenant_id)
) WITH (fillfactor = 70);
CREATE INDEX ix_tenant_queues_pick ON scraping.tenant_queues (priority, start_tag, tenant_id)
    WHERE ready;

CREATE TABLE scraping.tenant_flows (
    domain text NOT NULL,
    priority text NOT NULL REFERENCES scraping.pick_classes (priority),
    tenant_id uuid NOT NULL REFERENCES scraping.tenants (id) ON DELETE CASCADE,
    head_tag double precision NOT NULL,
    ready boolean NOT NULL DEFAULT true,
    waiting_for text CHECK (waiting_for IN ('room', 'due')),
    wake_at timestamptz,
    PRIMARY KEY (domain, priority, tenant_id),
    CHECK (ready = (waiting_for IS NULL) AND ready = (wake_at IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX ix_tenant_flows_pick ON scraping.tenant_flows (priority, tenant_id, head_tag, domain)
    WHERE ready;
CREATE INDEX ix_tenant_flows_wake ON scraping.tenant_flows (wake_at) WHERE NOT ready;
CREATE INDEX ix_tenant_flows_domain_ready ON scraping.tenant_flows (domain, priority)
    WHERE ready;
CREATE INDEX ix_tenant_flows_room ON scraping.tenant_flows (domain, wake_at)
    WHERE waiting_for = 'room';

CREATE INDEX ix_jobs_flow_head ON scraping.jobs (domain, priority, tenant_id, fair_tag, id)
    WHERE status = 'queued';

-- The queued jobs' flows and tenants: a flow on a paused domain set aside until its pause
-- ends, every other one ready (the claim sets aside what it finds without room or not
-- due); every tenant at the clock.
INSERT INTO scraping.tenant_flows (domain, priority, tenant_id, head_tag, ready, waiting_for,
                                   wake_at)
SELECT j.domain, j.priority, j.tenant_id, min(j.fair_tag), d.blocked_until IS NULL,
       CASE WHEN d.blocked_until IS NOT NULL THEN 'room' END, d.blocked_until
FROM scraping.jobs j
LEFT JOIN scraping.domains d ON d.domain = j.domain AND d.blocked_until > now()
WHERE j.status = 'queued'
GROUP BY j.domain, j.priority, j.tenant_id, d.blocked_until;
INSERT INTO scraping.tenant_queues (priority, tenant_id, start_tag)
SELECT DISTINCT j.priority, j.tenant_id, 0 FROM scraping.jobs j WHERE j.status = 'queued';

DROP FUNCTION scraping.announce_queued_jobs(text, text, double precision, timestamptz);

-- Frozen copies of pin_orchestration/scraping/sql/{domain_queues,claim_jobs,redirect_slots,
-- submit_job}.sql
-- at this revision.

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
-- decide whose turn it is. Concurrent intake of one tenant into one class serialises on
-- its tenant_vtimes row, nothing else.
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
    FROM scraping.pick_classes c WHERE c.priority = p_priority
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
        -- claim to meet them (a tenant row a claim or intake holds is left to it).
        UPDATE scraping.tenant_queues t SET ready = false
        WHERE t.ctid = ANY (ARRAY(
            SELECT t2.ctid FROM scraping.tenant_queues t2
            WHERE (t2.priority, t2.tenant_id) IN (
                    SELECT f.priority, f.tenant_id FROM scraping.tenant_flows f
                    WHERE f.domain = NEW.domain)
              AND t2.ready
              AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                              WHERE f.priority = t2.priority
                                AND f.tenant_id = t2.tenant_id AND f.ready)
            FOR NO KEY UPDATE SKIP LOCKED));
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
        JOIN scraping.pick_classes c ON c.priority = j.priority
        WHERE j.domain = OLD.domain AND j.status = 'queued'
        ON CONFLICT (priority, tenant_id) DO UPDATE
        SET ready = true, start_tag = greatest(t.start_tag, EXCLUDED.start_tag)
        WHERE NOT t.ready;
    END IF;
    RETURN NULL;
END
$fn$;

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
--    (pick_classes.start_clock) is the largest tag picked. A tenant none of whose flows can
--    be claimed (every one on a domain without room, or not due) is parked: it leaves the
--    pick, and its tag stands still, so jobs waiting on a paused or full domain neither
--    cost nor bank a turn. It comes back when one of its flows wakes (here, at the next
--    claim) or when a job of it can be claimed at intake, at the class clock or its own
--    tag, whichever is later. Bound: two tenants of weights w_a and w_b with claimable
--    work all through a run of picks by one claim start n_a and n_b jobs with
--    |n_a/w_a - n_b/w_b| <= 1/w_a + 1/w_b.
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
-- from (few tenants, many claimers): for the first of them, in a subtransaction, without
-- a limit while it holds no lock, at most half a second once it holds some; a wait ended
-- by the deadlock detector or that limit only ends the class's picks in this call. The connection count is taken in the probe's
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
-- writes its attempt rows. Nothing per pick grows with tenants, domains, paused domains or
-- queue depth.
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
    c_tclock double precision[];
    c_sclock double precision[];
    c_done boolean[] := ARRAY[false, false, false];
    v_clock bigint;
    ci integer;
    n_picked integer := 0;
    n_set_aside integer := 0;
    v_now timestamptz;
    v_tenant uuid;
    v_tenant_tag double precision;
    v_weight double precision;
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
    k integer;
    kt integer;
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
    tc_tag double precision[] := '{}';
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
    -- whether this call holds a row lock yet: until it does, it may wait for one without
    -- any risk of a deadlock (a waiter holding nothing is in no cycle), so without a limit
    v_holds_locks boolean := false;
    v_counted_now boolean;
    -- waiting for a tenant: the one locked, and those found with nothing to claim
    v_waited uuid;
    v_waited_empty uuid[] := '{}';
    v_lock_timeout text;
    v_bucket boolean;
    -- the tenants of the flows set aside together
    v_aside uuid[];
    w_flow tid[];
    w_priority text[];
    w_tenant uuid[];
    w_tenant_row tid[];
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;

    SELECT array_agg(60 / share ORDER BY array_position(c_name, priority)),
           array_agg(vtime ORDER BY array_position(c_name, priority)),
           array_agg(last_start ORDER BY array_position(c_name, priority)),
           array_agg(tenant_clock ORDER BY array_position(c_name, priority)),
           array_agg(start_clock ORDER BY array_position(c_name, priority)),
           max(last_start)
    INTO c_step, c_finish, c_start, c_tclock, c_sclock, v_clock
    FROM scraping.pick_classes;

    -- Flows whose wait is over come back into their tenant's pick, and a parked tenant of
    -- such a flow comes back at the class clock or its own tag, whichever is later (a
    -- bounded batch per call; rows another transaction holds are skipped, not waited for,
    -- and a flow whose tenant row is held stays for the next claim, so no tenant is left
    -- parked with a flow ready). The clock is read into a variable first: compared with
    -- clock_timestamp() itself (volatile) the wake time is no index bound.
    v_now := clock_timestamp();
    SELECT array_agg(w.ctid), array_agg(w.priority), array_agg(w.tenant_id)
    INTO w_flow, w_priority, w_tenant
    FROM (
        SELECT f.ctid, f.priority, f.tenant_id FROM scraping.tenant_flows f
        WHERE NOT f.ready AND f.wake_at <= v_now
        ORDER BY f.wake_at
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
    ) w;
    IF w_flow IS NOT NULL THEN
        v_holds_locks := true;
        SELECT array_agg(t.ctid) INTO w_tenant_row
        FROM (
            SELECT t.ctid FROM scraping.tenant_queues t
            WHERE (t.priority, t.tenant_id) IN (
                SELECT u.p, u.t FROM unnest(w_priority, w_tenant) AS u(p, t))
            ORDER BY t.priority, t.tenant_id
            FOR NO KEY UPDATE SKIP LOCKED
        ) t;
        UPDATE scraping.tenant_flows f
        SET ready = true, waiting_for = NULL, wake_at = NULL
        FROM unnest(w_flow, w_priority, w_tenant) AS u(flow, p, t)
        WHERE f.ctid = u.flow
          -- (before the tenants are written: their rows are found by ctid)
          AND EXISTS (SELECT 1 FROM scraping.tenant_queues t
                      WHERE t.ctid = ANY (w_tenant_row)
                        AND t.priority = u.p AND t.tenant_id = u.t);
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
            SELECT t.tenant_id, t.start_tag, tn.weight INTO v_tenant, v_tenant_tag, v_weight
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
                SELECT tn.weight INTO v_weight FROM scraping.tenants tn WHERE tn.id = v_tenant;
            ELSIF v_tenant IS NULL THEN
                -- Every tenant of the class with claimable work is being claimed from by
                -- other claims: wait for the first of them rather than answer "nothing to
                -- do", then probe again. Each wait is a subtransaction: when the claim
                -- waited for left that tenant with nothing to claim, its lock is let go
                -- again and the next one is waited for. A claim holding locks already
                -- waits at most half a second, and a wait that closes a cycle with another
                -- claim's (the deadlock detector, or the timeout, ends it) only ends this
                -- class's picks: no claim fails or stalls for it.
                v_waited_empty := '{}';
                v_lock_timeout := current_setting('lock_timeout');
                IF v_holds_locks THEN
                    PERFORM set_config('lock_timeout', '500ms', true);
                END IF;
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
                    v_holds_locks := true;
                    CONTINUE tenants;
                END IF;
                c_done[ci] := true;
                CONTINUE picks;
            ELSE
                kt := NULL;
            END IF;
            v_holds_locks := true;
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
                    -- to the claims that meet them).
                    v_aside := ARRAY(
                        SELECT DISTINCT w.tenant_id FROM scraping.set_domain_flows_aside(
                            v_fdomain, c_name[ci], v_tenant, v_due,
                            CASE WHEN v_bucket THEN 1 / v_rps ELSE 0 END) AS w);
                    UPDATE scraping.tenant_queues t SET ready = false
                    WHERE t.ctid = ANY (ARRAY(
                        SELECT p.row_id FROM unnest(v_aside) AS u(tenant_id)
                        CROSS JOIN LATERAL (
                            SELECT t2.ctid AS row_id FROM scraping.tenant_queues t2
                            WHERE t2.priority = c_name[ci] AND t2.tenant_id = u.tenant_id
                              AND t2.ready
                              AND NOT EXISTS (SELECT 1 FROM scraping.tenant_flows f
                                              WHERE f.priority = t2.priority
                                                AND f.tenant_id = t2.tenant_id AND f.ready)
                            FOR NO KEY UPDATE SKIP LOCKED) p));
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
                          AND j.status = 'queued' AND j.id <> ALL (picked) AND j.id <> h.id
                        ORDER BY j.fair_tag, j.id
                        LIMIT 1)
                INTO v_job_id, v_tag, v_next
                FROM (
                    SELECT j.id, j.fair_tag FROM scraping.jobs j
                    WHERE j.domain = v_fdomain AND j.priority = c_name[ci]
                      AND j.tenant_id = v_tenant
                      AND j.status = 'queued' AND j.next_attempt_at <= v_now
                      AND j.cancel_requested_at IS NULL AND j.id <> ALL (picked)
                    ORDER BY j.fair_tag, j.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED
                ) h;
                IF NOT FOUND THEN
                    SELECT min(j.next_attempt_at) INTO v_due FROM scraping.jobs j
                    WHERE j.domain = v_fdomain AND j.priority = c_name[ci]
                      AND j.tenant_id = v_tenant
                      AND j.status = 'queued' AND j.cancel_requested_at IS NULL
                      AND j.id <> ALL (picked);
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
                tc_tag[kt] := tc_tag[kt] + 1.0 / v_weight;
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

    -- The class state, unless another claim is writing it right now: then its write
    -- stands (both continued the sequence from the same state), and this claim never
    -- waits. All three rows or none, so the state stays one point of the sequence.
    PERFORM 1 FROM scraping.pick_classes FOR UPDATE SKIP LOCKED;
    GET DIAGNOSTICS n_locked = ROW_COUNT;
    IF n_locked = 3 THEN
        UPDATE scraping.pick_classes c
        SET vtime = c_finish[ck], last_start = c_start[ck],
            tenant_clock = greatest(c.tenant_clock, c_tclock[ck]),
            start_clock = greatest(c.start_clock, c_sclock[ck])
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

-- The hop's fetch ended: its connection is free, so the domain's flows set aside for want
-- of one look again at the next claim (as a job leaving `running` does).
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
        PERFORM scraping.wake_room_flows(v_domain_name);
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
