-- Why a queued job waits (scraping/wait_reasons.py), read from the state the claim keeps
-- (scraping/sql/claim_jobs.sql) with the claim's own predicates, in the claim's order:
-- a host's pause, the job's due time, the host's token bucket, its connections, then
-- the order of picks (fair tags on the host, the classes' 6:3:1 sequence), then the
-- host's robots.txt (the worker's, after the claim). Nothing is
-- written per claim for it: one read, a few index probes, when a client asks.

-- name: job_wait
WITH j AS (
    SELECT j.id, j.tenant_id, j.domain, j.priority, j.fair_tag, j.next_attempt_at,
           j.last_error_class
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
       -- the jobs the claim takes from this host before this one (smaller tag), counted
       -- up to 1000
       (SELECT count(*) FROM (
            SELECT x.tenant_id FROM scraping.jobs x
            WHERE x.domain = j.domain AND x.priority = j.priority AND x.status = 'queued'
              AND x.next_attempt_at <= clock_timestamp() AND x.cancel_requested_at IS NULL
              AND (x.fair_tag, x.id) < (j.fair_tag, j.id)
            ORDER BY x.fair_tag, x.id
            LIMIT 1000) a) AS ahead,
       (SELECT count(*) FROM (
            SELECT 1 FROM scraping.jobs x
            WHERE x.domain = j.domain AND x.priority = j.priority AND x.status = 'queued'
              AND x.next_attempt_at <= clock_timestamp() AND x.cancel_requested_at IS NULL
              AND (x.fair_tag, x.id) < (j.fair_tag, j.id) AND x.tenant_id <> j.tenant_id
            ORDER BY x.fair_tag, x.id
            LIMIT 1000) a) AS others_ahead,
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
