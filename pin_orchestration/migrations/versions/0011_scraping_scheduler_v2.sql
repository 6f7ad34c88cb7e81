-- Migration 0011 (issue 15): the scheduler at scale. Frozen here: later revisions change
-- pin_orchestration/scraping/sql/*.sql and freeze their own copy.

ALTER TABLE scraping.jobs ADD COLUMN fair_tag double precision;

CREATE TABLE scraping.domain_queues (
    domain text NOT NULL,
    priority text NOT NULL REFERENCES scraping.pick_classes (priority),
    -- The smallest fair tag of the queue's jobs (the claim keeps it; a cancel may leave it
    -- low until the next pick from the queue).
    head_tag double precision NOT NULL,
    -- In the pick while true; set aside until wake_at while false.
    ready boolean NOT NULL DEFAULT true,
    waiting_for text CHECK (waiting_for IN ('room', 'due')),
    wake_at timestamptz,
    PRIMARY KEY (domain, priority),
    CHECK (ready = (waiting_for IS NULL) AND ready = (wake_at IS NULL))
) WITH (fillfactor = 70);
CREATE INDEX ix_domain_queues_pick ON scraping.domain_queues (priority, head_tag, domain)
    WHERE ready;
CREATE INDEX ix_domain_queues_wake ON scraping.domain_queues (wake_at) WHERE NOT ready;

-- A domain's due head in one class; replaces 0007's per-tenant pick indexes.
CREATE INDEX ix_jobs_domain_head ON scraping.jobs (domain, priority, fair_tag, id)
    WHERE status = 'queued';
DROP INDEX scraping.ix_jobs_pick;
DROP INDEX scraping.ix_jobs_pick_domain;

-- Jobs queued before this revision: tags in due order per tenant and class, from each
-- tenant's finish tag (tenant_vtimes now holds the finish tag of the tenant's last queued
-- job, no longer of its last started one).
WITH ordered AS (
    SELECT j.id, j.priority, j.tenant_id,
           greatest(coalesce(v.vtime, 0), c.tenant_clock)
               + (row_number() OVER w - 1) / t.weight AS tag,
           1 / t.weight AS step
    FROM scraping.jobs j
    JOIN scraping.tenants t ON t.id = j.tenant_id
    JOIN scraping.pick_classes c ON c.priority = j.priority
    LEFT JOIN scraping.tenant_vtimes v ON v.priority = j.priority AND v.tenant_id = j.tenant_id
    WHERE j.status = 'queued'
    WINDOW w AS (PARTITION BY j.priority, j.tenant_id ORDER BY j.next_attempt_at, j.id)
), tagged AS (
    UPDATE scraping.jobs j SET fair_tag = o.tag FROM ordered o WHERE j.id = o.id
    RETURNING o.priority, o.tenant_id, o.tag, o.step
)
INSERT INTO scraping.tenant_vtimes AS v (priority, tenant_id, vtime)
SELECT priority, tenant_id, max(tag + step) FROM tagged GROUP BY priority, tenant_id
ON CONFLICT (priority, tenant_id) DO UPDATE SET vtime = EXCLUDED.vtime;

INSERT INTO scraping.domains (domain)
SELECT DISTINCT domain FROM scraping.jobs WHERE status = 'queued'
ON CONFLICT (domain) DO NOTHING;
INSERT INTO scraping.domain_queues (domain, priority, head_tag)
SELECT domain, priority, min(fair_tag) FROM scraping.jobs WHERE status = 'queued'
GROUP BY domain, priority;

-- Frozen copies of pin_orchestration/scraping/sql/{domain_queues,claim_jobs,submit_job,pause_domain}.sql

-- The scheduler's write-time state (migration 0011): a job's fair tag, the (domain, class)
-- queues the claim picks from, and what sets a queue aside or brings it back. Triggers on
-- scraping.jobs and scraping.domains keep it, so every writer (intake, the worker's
-- outcomes, the sweeper, the runbook requeue, an operator's SQL) keeps it right.

-- A job entering the queue takes its tenant's next start tag in its class: the tenant's
-- last finish tag or the class clock (the largest tag picked), whichever is later; the
-- finish tag then grows by 1/weight. Concurrent intake of one tenant into one class
-- serialises on its tenant_vtimes row, nothing else.
CREATE OR REPLACE FUNCTION scraping.jobs_fair_tag() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_step double precision;
    v_clock double precision;
BEGIN
    SELECT 1.0 / t.weight INTO v_step FROM scraping.tenants t WHERE t.id = NEW.tenant_id;
    SELECT c.tenant_clock INTO v_clock FROM scraping.pick_classes c
    WHERE c.priority = NEW.priority;
    INSERT INTO scraping.tenant_vtimes AS v (priority, tenant_id, vtime)
    VALUES (NEW.priority, NEW.tenant_id, v_clock + v_step)
    ON CONFLICT (priority, tenant_id) DO UPDATE
    SET vtime = greatest(v.vtime, v_clock) + v_step
    RETURNING v.vtime - v_step INTO NEW.fair_tag;
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

-- After a job's status changes: a job entering the queue is announced to its (domain,
-- class) queue (made, its head lowered, or woken early when it waited for a due job); a
-- job leaving `running` frees a connection, so the domain's queues waiting for room look
-- again at the next claim.
CREATE OR REPLACE FUNCTION scraping.jobs_domain_queue() RETURNS trigger
LANGUAGE plpgsql AS $fn$
DECLARE
    v_blocked timestamptz;
BEGIN
    IF NEW.status = 'queued' AND (TG_OP = 'INSERT' OR OLD.status <> 'queued') THEN
        -- The common case writes nothing: a queue that already sorts at or before this
        -- job and is not waiting for a later due time (so intake does not lock a row a
        -- claim may be holding).
        PERFORM 1 FROM scraping.domain_queues q
        WHERE q.domain = NEW.domain AND q.priority = NEW.priority
          AND q.head_tag <= NEW.fair_tag
          AND (q.ready OR q.waiting_for = 'room' OR q.wake_at <= NEW.next_attempt_at);
        IF NOT FOUND THEN
            INSERT INTO scraping.domains (domain) VALUES (NEW.domain)
            ON CONFLICT (domain) DO NOTHING;
            SELECT d.blocked_until INTO v_blocked FROM scraping.domains d
            WHERE d.domain = NEW.domain AND d.blocked_until > clock_timestamp();
            INSERT INTO scraping.domain_queues AS q
                (domain, priority, head_tag, ready, waiting_for, wake_at)
            SELECT NEW.domain, NEW.priority, NEW.fair_tag, s.waiting_for IS NULL,
                   s.waiting_for, s.wake_at
            FROM (SELECT CASE WHEN v_blocked IS NOT NULL THEN 'room'
                              WHEN NEW.next_attempt_at > clock_timestamp() THEN 'due'
                         END AS waiting_for,
                         coalesce(v_blocked, CASE WHEN NEW.next_attempt_at > clock_timestamp()
                                                  THEN NEW.next_attempt_at END) AS wake_at) s
            ON CONFLICT (domain, priority) DO UPDATE
            SET head_tag = least(q.head_tag, EXCLUDED.head_tag),
                wake_at = CASE WHEN q.waiting_for = 'due'
                               THEN least(q.wake_at, NEW.next_attempt_at)
                               ELSE q.wake_at END;
        END IF;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD.status = 'running' AND NEW.status <> 'running' THEN
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

-- scraping.claim_jobs: the pick (README "Scheduling"; the design in migration 0011).
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
-- Plan per pick (EXPLAIN ANALYZE: bench/scheduler_cases.py, bench/README.md): one probe of
-- ix_domain_queues_pick (priority, head_tag) WHERE ready; the domains row by primary key;
-- the running jobs of that domain (ix_jobs_running_domain, <= its concurrency); the head
-- job and then the queue's next head by ix_jobs_domain_head (domain, priority, fair_tag,
-- id) WHERE queued; the token written back. At the end one UPDATE claims the batch (each
-- job's lease stamped with its pick's clock_timestamp()) and one INSERT writes its
-- attempt rows. Nothing here grows with tenants, domains, paused domains or queue depth.
CREATE OR REPLACE FUNCTION scraping.claim_jobs(
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS SETOF scraping.jobs
LANGUAGE plpgsql VOLATILE AS $fn$
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
    -- domains whose state row another claim holds: left to it for the rest of this call
    skipped text[] := '{}';
    v_now timestamptz;
    v_queue record;
    v_domain scraping.domains;
    v_rps double precision;
    v_concurrency integer;
    v_tokens double precision;
    v_running integer;
    v_job_id uuid;
    v_tag double precision;
    picked uuid[] := '{}';
    picked_at timestamptz[] := '{}';
    picked_domain text[] := '{}';
    v_next double precision;
    v_due timestamptz;
    n_locked integer;
    -- whether this call holds a row lock yet: until it does, it may wait for one without
    -- any risk of a deadlock (a waiter holding nothing is in no cycle)
    v_holds_locks boolean := false;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;

    -- Domain queues whose wait is over come back into the pick (a bounded batch per call;
    -- rows another claim is waking are skipped, not waited for).
    UPDATE scraping.domain_queues q
    SET ready = true, wake_at = NULL, waiting_for = NULL
    FROM (
        SELECT w.domain, w.priority FROM scraping.domain_queues w
        WHERE NOT w.ready AND w.wake_at <= clock_timestamp()
        ORDER BY w.wake_at
        LIMIT 1000
        FOR UPDATE SKIP LOCKED
    ) due
    WHERE q.domain = due.domain AND q.priority = due.priority;
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
        FOR k IN 1..3 LOOP
            CONTINUE WHEN c_done[k];
            IF ci IS NULL OR greatest(c_finish[k], v_clock) < greatest(c_finish[ci], v_clock)
            THEN
                ci := k;
            END IF;
        END LOOP;
        EXIT picks WHEN ci IS NULL;

        <<domains>>
        LOOP
            -- 2. the class's domain queue with the smallest head tag
            SELECT q.domain, q.head_tag INTO v_queue
            FROM scraping.domain_queues q
            WHERE q.priority = c_name[ci] AND q.ready AND q.domain <> ALL (skipped)
            ORDER BY q.head_tag, q.domain
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND AND NOT v_holds_locks THEN
                -- Every queue with room is being picked from by other claims (one busy
                -- site): wait for the first of them rather than answer "nothing to do".
                SELECT q.domain, q.head_tag INTO v_queue
                FROM scraping.domain_queues q
                WHERE q.priority = c_name[ci] AND q.ready AND q.domain <> ALL (skipped)
                ORDER BY q.head_tag, q.domain
                LIMIT 1
                FOR UPDATE;
            END IF;
            IF NOT FOUND THEN
                c_done[ci] := true;
                CONTINUE picks;
            END IF;
            v_holds_locks := true;

            SELECT d.* INTO v_domain FROM scraping.domains d
            WHERE d.domain = v_queue.domain
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                skipped := skipped || v_queue.domain;
                CONTINUE domains;
            END IF;
            v_now := clock_timestamp();

            -- 3. room: no pause, a token in the bucket, a free connection
            IF v_domain.blocked_until > v_now THEN
                PERFORM scraping.set_domain_queue_aside(
                    v_queue.domain, c_name[ci], 'room', v_domain.blocked_until);
                CONTINUE domains;
            END IF;
            v_rps := coalesce(v_domain.rps, p_default_rps);
            v_concurrency := coalesce(v_domain.concurrency, p_default_concurrency);
            v_tokens := CASE
                WHEN v_domain.tokens IS NULL THEN greatest(1.0, v_rps)
                ELSE least(greatest(1.0, v_rps),
                           v_domain.tokens + v_rps * greatest(
                               0.0, extract(epoch FROM v_now - v_domain.tokens_at)))
            END;
            IF v_tokens < 1 THEN
                PERFORM scraping.set_domain_queue_aside(
                    v_queue.domain, c_name[ci], 'room',
                    v_now + make_interval(secs => (1 - v_tokens) / v_rps));
                CONTINUE domains;
            END IF;
            SELECT count(*) + (SELECT count(*) FROM unnest(picked_domain) AS p(d)
                               WHERE p.d = v_queue.domain)
            INTO v_running FROM scraping.jobs j
            WHERE j.status = 'running' AND j.domain = v_queue.domain;
            IF v_running >= v_concurrency THEN
                -- A finishing job wakes it (trigger jobs_domain_queue); the second is a
                -- safety net for a finish that committed while this claim was deciding.
                PERFORM scraping.set_domain_queue_aside(
                    v_queue.domain, c_name[ci], 'room', v_now + interval '1 second');
                CONTINUE domains;
            END IF;

            -- 4. the domain's due job with the smallest tag; never one asked to cancel
            SELECT j.id, j.fair_tag INTO v_job_id, v_tag FROM scraping.jobs j
            WHERE j.domain = v_queue.domain AND j.priority = c_name[ci]
              AND j.status = 'queued' AND j.next_attempt_at <= v_now
              AND j.cancel_requested_at IS NULL AND j.id <> ALL (picked)
            ORDER BY j.fair_tag, j.id
            LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                SELECT min(j.next_attempt_at) INTO v_due FROM scraping.jobs j
                WHERE j.domain = v_queue.domain AND j.priority = c_name[ci]
                  AND j.status = 'queued' AND j.cancel_requested_at IS NULL
                  AND j.id <> ALL (picked);
                IF v_due IS NULL THEN
                    DELETE FROM scraping.domain_queues q
                    WHERE q.domain = v_queue.domain AND q.priority = c_name[ci];
                ELSE
                    -- Not due yet, or its due jobs held by another transaction (a cancel).
                    PERFORM scraping.set_domain_queue_aside(
                        v_queue.domain, c_name[ci], 'due',
                        greatest(v_due, v_now + interval '1 second'));
                END IF;
                CONTINUE domains;
            END IF;

            -- The pick: spend the domain's token and connection, advance both clocks. The
            -- jobs are claimed together at the end, each stamped with its pick's moment.
            picked := picked || v_job_id;
            picked_at := picked_at || v_now;
            picked_domain := picked_domain || v_queue.domain;
            n_picked := n_picked + 1;

            v_tokens := v_tokens - 1;
            UPDATE scraping.domains d
            SET tokens = v_tokens, tokens_at = greatest(v_now, d.tokens_at)
            WHERE d.domain = v_queue.domain;

            SELECT j.fair_tag INTO v_next FROM scraping.jobs j
            WHERE j.domain = v_queue.domain AND j.priority = c_name[ci] AND j.status = 'queued'
              AND j.id <> ALL (picked)
            ORDER BY j.fair_tag, j.id
            LIMIT 1;
            IF v_next IS NULL THEN
                DELETE FROM scraping.domain_queues q
                WHERE q.domain = v_queue.domain AND q.priority = c_name[ci];
            ELSIF v_tokens < 1 THEN
                UPDATE scraping.domain_queues q
                SET head_tag = v_next, ready = false, waiting_for = 'room',
                    wake_at = v_now + make_interval(secs => (1 - v_tokens) / v_rps)
                WHERE q.domain = v_queue.domain AND q.priority = c_name[ci];
            ELSIF v_running + 1 >= v_concurrency THEN
                UPDATE scraping.domain_queues q
                SET head_tag = v_next, ready = false, waiting_for = 'room',
                    wake_at = v_now + interval '1 second'
                WHERE q.domain = v_queue.domain AND q.priority = c_name[ci];
            ELSIF v_next <> v_queue.head_tag THEN
                UPDATE scraping.domain_queues q SET head_tag = v_next
                WHERE q.domain = v_queue.domain AND q.priority = c_name[ci];
            END IF;

            c_tclock[ci] := greatest(c_tclock[ci], v_tag);
            v_clock := greatest(c_finish[ci], v_clock);
            c_start[ci] := v_clock;
            c_finish[ci] := v_clock + c_step[ci];
            CONTINUE picks;
        END LOOP domains;
    END LOOP picks;

    IF n_picked = 0 THEN
        RETURN;
    END IF;
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

-- Intake from SQL (README "Scheduling", docs/integration.md): the one path by which a job
-- enters scraping.jobs. POST /jobs and the Python helper call it; another service calls it
-- in its own transaction (the job exists exactly when that transaction commits), one row
-- or set-based (`SELECT scraping.submit_job(t.id, u.url) FROM …`).

-- A host as the politeness limits key it (Python: repository.normalize_host): no trailing
-- dot, no brackets around an IPv6 literal, lowercased; a non-ASCII label in its IDNA
-- (punycode, RFC 3492) form after NFKC normalisation.
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
    IF v_host ~ '^[\x01-\x7f]*$' OR position(':' IN v_host) > 0 THEN
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
-- Validates as POST /jobs does (SQLSTATE 22023, the message naming the argument), derives
-- the domain, inserts the job (its fair tag and domain queue come from the triggers of
-- migration 0011). Same key and same body: the first job's id; same key, other body:
-- SQLSTATE 23505 naming the key. A key is remembered 24 hours (the API's documented TTL).
DECLARE
    v_authority text;
    v_host text;
    v_digest text;
    v_id uuid;
    v_existing record;
BEGIN
    IF p_tenant_id IS NULL
       OR NOT EXISTS (SELECT 1 FROM scraping.tenants t WHERE t.id = p_tenant_id) THEN
        RAISE EXCEPTION 'p_tenant_id: no tenant %', coalesce(p_tenant_id::text, 'NULL')
            USING ERRCODE = '22023', HINT = 'pin tenant list shows the tenants';
    END IF;
    PERFORM scraping.check_job_url(p_url, 'p_url');
    IF p_callback_url IS NOT NULL THEN
        PERFORM scraping.check_job_url(p_callback_url, 'p_callback_url');
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

    v_authority := substring(p_url FROM '^[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)');
    v_authority := regexp_replace(v_authority, '^.*@', '');
    IF v_authority LIKE '[%' THEN
        v_host := substring(v_authority FROM '^(\[[^]]*\])');
    ELSE
        v_host := split_part(v_authority, ':', 1);
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
        pin.uuid7(), p_tenant_id, p_url, scraping.idna_host(v_host), p_params,
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

-- A job's URL or callback as POST /jobs accepts it: http(s), a host, at most 2048
-- characters, no whitespace.
CREATE OR REPLACE FUNCTION scraping.check_job_url(p_url text, p_argument text) RETURNS void
LANGUAGE plpgsql IMMUTABLE AS $fn$
DECLARE
    v_authority text;
    v_port text;
BEGIN
    IF p_url IS NULL THEN
        RAISE EXCEPTION '% must not be NULL', p_argument USING ERRCODE = '22023';
    END IF;
    IF length(p_url) > 2048 THEN
        RAISE EXCEPTION '% is longer than 2048 characters', p_argument USING ERRCODE = '22023';
    END IF;
    IF p_url ~ '\s' THEN
        RAISE EXCEPTION '% must not contain whitespace', p_argument USING ERRCODE = '22023';
    END IF;
    v_authority := substring(p_url FROM '^[Hh][Tt][Tt][Pp][Ss]?://([^/?#]*)');
    IF v_authority IS NULL THEN
        RAISE EXCEPTION '% must be an http:// or https:// URL (got %)',
            p_argument, quote_literal(left(p_url, 80))
            USING ERRCODE = '22023';
    END IF;
    v_authority := regexp_replace(v_authority, '^.*@', '');
    v_port := substring(v_authority FROM '(?:^\[[^]]*\]|^[^:\[]*):(.*)$');
    IF regexp_replace(v_authority, '^(\[[^]]*\]|[^:]*).*$', '\1') IN ('', '[]') THEN
        RAISE EXCEPTION '% has no host', p_argument USING ERRCODE = '22023';
    END IF;
    IF v_port IS NOT NULL AND v_port <> ''
       AND (v_port !~ '^[0-9]{1,5}$' OR v_port::integer NOT BETWEEN 1 AND 65535) THEN
        RAISE EXCEPTION '% has an invalid port %', p_argument, quote_literal(v_port)
            USING ERRCODE = '22023';
    END IF;
END
$fn$;

-- A domain's pause (a 429 or Retry-After from it, or an operator): no worker sends it
-- anything before the pause ends. The pause kept is capped at the session's
-- pin.scraping_max_pause_seconds (the worker sets it from PIN_SCRAPING_MAX_PAUSE_SECONDS;
-- 3600 when unset), so `Retry-After: Fri, 31 Dec 9999 …` cannot stop a domain for every
-- tenant for ever. A longer pause already in force stands; p_until NULL or in the past
-- lifts the pause (`pin scraping domain resume`). Returns the pause kept (NULL: none).
CREATE OR REPLACE FUNCTION scraping.pause_domain(p_domain text, p_until timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    v_cap double precision := coalesce(
        nullif(current_setting('pin.scraping_max_pause_seconds', true), '')::double precision,
        3600);
    v_until timestamptz;
    v_kept timestamptz;
BEGIN
    IF p_domain IS NULL OR btrim(p_domain) = '' THEN
        RAISE EXCEPTION 'p_domain must name a host' USING ERRCODE = '22023';
    END IF;
    IF p_until IS NULL OR p_until <= clock_timestamp() THEN
        UPDATE scraping.domains d SET blocked_until = NULL, updated_at = now()
        WHERE d.domain = scraping.idna_host(p_domain) AND d.blocked_until IS NOT NULL;
        RETURN NULL;
    END IF;
    v_until := least(p_until, clock_timestamp() + make_interval(secs => v_cap));
    INSERT INTO scraping.domains AS d (domain, blocked_until)
    VALUES (scraping.idna_host(p_domain), v_until)
    ON CONFLICT (domain) DO UPDATE
    SET blocked_until = greatest(
            least(coalesce(d.blocked_until, '-infinity'),
                  clock_timestamp() + make_interval(secs => v_cap)),
            EXCLUDED.blocked_until),
        updated_at = now()
    RETURNING d.blocked_until INTO v_kept;
    RETURN v_kept;
END
$fn$;

CREATE TRIGGER jobs_fair_tag_insert BEFORE INSERT ON scraping.jobs
    FOR EACH ROW WHEN (NEW.status = 'queued')
    EXECUTE FUNCTION scraping.jobs_fair_tag();
CREATE TRIGGER jobs_fair_tag_requeue BEFORE UPDATE OF status ON scraping.jobs
    FOR EACH ROW WHEN (NEW.status = 'queued' AND OLD.status <> 'queued')
    EXECUTE FUNCTION scraping.jobs_fair_tag();
CREATE TRIGGER jobs_domain_queue_insert AFTER INSERT ON scraping.jobs
    FOR EACH ROW WHEN (NEW.status = 'queued')
    EXECUTE FUNCTION scraping.jobs_domain_queue();
CREATE TRIGGER jobs_domain_queue_update AFTER UPDATE OF status ON scraping.jobs
    FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
                       AND (NEW.status = 'queued' OR OLD.status = 'running'))
    EXECUTE FUNCTION scraping.jobs_domain_queue();
CREATE TRIGGER domains_domain_queue_insert AFTER INSERT ON scraping.domains
    FOR EACH ROW WHEN (NEW.blocked_until IS NOT NULL)
    EXECUTE FUNCTION scraping.domains_domain_queue();
CREATE TRIGGER domains_domain_queue_update
    AFTER UPDATE OF blocked_until, rps, concurrency ON scraping.domains
    FOR EACH ROW EXECUTE FUNCTION scraping.domains_domain_queue();
CREATE TRIGGER domains_deleted AFTER DELETE ON scraping.domains
    FOR EACH ROW EXECUTE FUNCTION scraping.domains_deleted();

-- Intake from another service's role: only through `pin db grant-raiser ROLE`.
REVOKE EXECUTE ON FUNCTION scraping.submit_job(uuid, text, jsonb, text, text, text) FROM PUBLIC;
