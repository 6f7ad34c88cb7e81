-- 0017 down: the claim of 0016 (a pick in about eight statements).
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
            v_tokens := scraping.domain_tokens(v_domain, v_rps, v_now);
            IF v_tokens < 1 THEN
                PERFORM scraping.set_domain_queue_aside(
                    v_queue.domain, c_name[ci], 'room',
                    v_now + make_interval(secs => (1 - v_tokens) / v_rps));
                CONTINUE domains;
            END IF;
            -- connections: its running jobs, this call's picks, and redirect hops of
            -- other domains' jobs to it (scraping.take_redirect_slot)
            SELECT count(*) + (SELECT count(*) FROM unnest(picked_domain) AS p(d)
                               WHERE p.d = v_queue.domain)
                   + (SELECT count(*) FROM scraping.redirect_slots s
                      WHERE s.domain = v_queue.domain AND s.expires_at > v_now)
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
