-- Why a queued job waits (scraping/wait_reasons.py), read from the state the claim keeps
-- (scraping/sql/claim_jobs.sql) with the claim's own predicates, in the claim's order:
-- a host's pause, the job's due time, the host's token bucket, its connections, then
-- the order of picks (the tenant's own jobs on the host, other tenants' turns, the
-- classes' 6:3:1 sequence), then the
-- host's robots.txt (the worker's, after the claim). Nothing is
-- written per claim for it: one read, a few index probes, when a client asks.

-- name: job_wait
WITH j AS (
    SELECT j.id, j.tenant_id, j.domain, j.priority, j.fair_tag, j.next_attempt_at,
           j.last_error_class, clock_timestamp() AS at
    FROM scraping.jobs j
    WHERE j.id = :job_id AND j.status = 'queued'
), d AS (
    SELECT d.domain, d.blocked_until, d.pause_cause, d.robots_mode,
           scraping.domain_tokens(d, coalesce(d.rps, :default_rps), clock_timestamp())
               AS tokens,
           coalesce(d.rps, :default_rps) AS rps,
           coalesce(d.concurrency, :default_concurrency) AS concurrency
    FROM scraping.domains d JOIN j ON d.domain = j.domain
), classes AS (
    SELECT c.priority, greatest(c.vtime, max(c.last_start) OVER ()) AS start_tag,
           array_position(ARRAY['high', 'normal', 'low'], c.priority) AS rank
    FROM scraping.pick_classes c
), turn AS NOT MATERIALIZED (
    -- a tenant's place in the turns of the job's class, as the claim reads it: its start
    -- tag, or for a parked tenant the class's clock if later (where it comes back)
    SELECT t.tenant_id,
           CASE WHEN t.ready THEN t.start_tag ELSE greatest(t.start_tag, c.start_clock) END
               AS tag
    FROM j
    JOIN scraping.tenant_queues t ON t.priority = j.priority
    JOIN scraping.class_clocks c ON c.priority = j.priority
), others AS NOT MATERIALIZED (
    -- the other tenants with a due job on the job's host in its class (their flows);
    -- read at j.at, not clock_timestamp() (volatile), so that each use below is inlined
    -- and stops at its own limit
    SELECT f.tenant_id FROM j
    JOIN scraping.tenant_flows f
      ON f.domain = j.domain AND f.priority = j.priority AND f.tenant_id <> j.tenant_id
    WHERE EXISTS (SELECT 1 FROM scraping.jobs x
                  WHERE x.domain = f.domain AND x.priority = f.priority
                    AND x.tenant_id = f.tenant_id AND x.status = 'queued'
                    AND x.next_attempt_at <= j.at
                    AND x.cancel_requested_at IS NULL)
)
SELECT clock_timestamp() AS as_of,
       j.next_attempt_at, j.last_error_class,
       d.blocked_until, d.pause_cause, d.robots_mode, d.tokens, d.rps, d.concurrency,
       r.state AS robots_state, r.expires_at AS robots_expires_at,
       coalesce(r.expires_at > clock_timestamp(), false) AS robots_fresh,
       coalesce(r.lease_expires_at > clock_timestamp(), false) AS robots_leased,
       (SELECT count(*) FROM scraping.jobs x
        WHERE x.status = 'running' AND x.domain = j.domain)
       + (SELECT count(*) FROM scraping.redirect_slots s
          WHERE s.domain = j.domain AND s.expires_at > clock_timestamp()) AS connections,
       -- this tenant's jobs the claim takes from the job's flow (its jobs on this host in
       -- this class) before it: the flow's due jobs with a smaller (fair tag, id), counted
       -- up to 1000
       (SELECT count(*) FROM (
            SELECT 1 FROM scraping.jobs x
            WHERE x.domain = j.domain AND x.priority = j.priority
              AND x.tenant_id = j.tenant_id AND x.status = 'queued'
              AND x.next_attempt_at <= clock_timestamp() AND x.cancel_requested_at IS NULL
              AND (x.fair_tag, x.id) < (j.fair_tag, j.id)
            ORDER BY x.fair_tag, x.id
            LIMIT 1000) a) AS ahead,
       -- the other tenants with a due job on this host in this class, up to 1000: the pick
       -- goes by tenant (their start tags), so they take turns with this one there
       (SELECT count(*) FROM (
            SELECT 1 FROM others LIMIT 1000) o) AS others,
       -- those of them whose turn comes before this tenant's next, by the pick's order
       -- (start tag, tenant id; a parked tenant comes back at the class's clock)
       (SELECT count(*) FROM (
            SELECT 1 FROM others o
            JOIN turn theirs ON theirs.tenant_id = o.tenant_id
            JOIN turn mine ON mine.tenant_id = j.tenant_id
            WHERE (theirs.tag, theirs.tenant_id) < (mine.tag, mine.tenant_id)
            LIMIT 1000) o) AS others_first,
       -- the class the next pick goes to, when not this job's: it has a queue in the pick
       -- and an earlier start tag in the 6:3:1 sequence
       (SELECT o.priority FROM classes o, classes mine
        WHERE mine.priority = j.priority AND o.priority <> j.priority
          AND (o.start_tag, o.rank) < (mine.start_tag, mine.rank)
          AND EXISTS (SELECT 1 FROM scraping.domain_queues q
                      WHERE q.priority = o.priority AND q.ready)
        ORDER BY o.start_tag, o.rank
        LIMIT 1) AS class_ahead
FROM j
LEFT JOIN d ON true
LEFT JOIN scraping.robots r ON r.origin = :origin

-- name: job_by_id
-- An operator's look at any tenant's job (`pin scraping job explain`).
SELECT j.id, j.status, j.url, j.domain, j.priority, t.name AS tenant, j.attempts,
       j.last_error_class, j.last_error, j.next_attempt_at
FROM scraping.jobs j JOIN scraping.tenants t ON t.id = j.tenant_id
WHERE j.id = :job_id
