-- robots.txt shared by every worker (scraping/robots.py): one row per origin in
-- scraping.robots, fetched by one worker at a time (its lease), the others wait for it.

-- name: robots_state
-- What a worker needs to judge a URL: the origin's robots.txt as stored (none: never
-- fetched), whether it is still good, whether another worker is fetching it now, and the
-- host's exemption.
SELECT (SELECT d.robots_mode FROM scraping.domains d WHERE d.domain = :domain) AS host_mode,
       r.state, r.body, r.fetched_at, r.expires_at, r.failures,
       coalesce(r.expires_at > now(), false) AS fresh,
       EXTRACT(EPOCH FROM r.expires_at - now()) AS expires_in,
       coalesce(r.lease_expires_at > now()
                AND EXISTS (SELECT 1 FROM scraping.jobs j
                            WHERE j.id = r.lease_job AND j.status = 'running'
                              AND j.lease_owner = r.lease_owner
                              AND j.lease_expires_at > now()), false) AS leased
FROM (VALUES (1)) AS one(x)
LEFT JOIN scraping.robots r ON r.origin = :origin

-- name: robots_take_lease
-- This worker fetches the origin's robots.txt for job :job_id: only when it is missing or
-- stale and no other worker holds a live lease on it (two takers race on the row: one
-- wins). A lease is live while it lasts and its job still runs under its worker with a
-- live lease of its own: a killed worker's is taken over once its job is swept or its
-- lease runs out, not after the whole robots lease. Returns the failures so far (the
-- backoff of another unreachable answer).
INSERT INTO scraping.robots AS r (origin, domain, lease_owner, lease_job, lease_expires_at)
VALUES (:origin, :domain, :owner, :job_id, now() + make_interval(secs => :lease_seconds))
ON CONFLICT (origin) DO UPDATE
SET lease_owner = EXCLUDED.lease_owner,
    lease_job = EXCLUDED.lease_job,
    lease_expires_at = EXCLUDED.lease_expires_at,
    updated_at = now()
WHERE (r.expires_at IS NULL OR r.expires_at <= now())
  AND (r.lease_expires_at IS NULL OR r.lease_expires_at <= now()
       OR NOT EXISTS (SELECT 1 FROM scraping.jobs j
                      WHERE j.id = r.lease_job AND j.status = 'running'
                        AND j.lease_owner = r.lease_owner AND j.lease_expires_at > now()))
RETURNING r.failures

-- name: robots_store
-- The answer, under this worker's lease (a worker whose lease ran out writes nothing).
-- An unreachable answer keeps nothing of the body and counts a failure; any other resets
-- the count.
UPDATE scraping.robots
SET state = :state,
    http_status = :http_status,
    body = :body,
    crawl_delay = :crawl_delay,
    fetched_at = now(),
    expires_at = now() + make_interval(secs => :ttl_seconds),
    failures = CASE WHEN :state = 'unreachable' THEN failures + 1 ELSE 0 END,
    last_error = :last_error,
    lease_owner = NULL,
    lease_job = NULL,
    lease_expires_at = NULL,
    updated_at = now()
WHERE origin = :origin AND lease_owner = :owner
RETURNING expires_at

-- name: robots_release_lease
UPDATE scraping.robots
SET lease_owner = NULL, lease_job = NULL, lease_expires_at = NULL, updated_at = now()
WHERE origin = :origin AND lease_owner = :owner

-- name: robots_crawl_delay
-- The host's Crawl-delay caps its rate for every worker (trigger domains_effective_rps):
-- the longest of its origins' robots.txt still fresh (http and https, other ports share
-- the host's rate; the last one stored wrote it, and one without a delay lifted the cap).
-- `rps` is named in the SET list, though the BEFORE trigger computes it, so the AFTER
-- UPDATE OF rps trigger (domains_domain_queue) fires: a delay lifted or shortened wakes
-- the flows set aside at the old token spacing (and brings back their parked tenants).
INSERT INTO scraping.domains AS d (domain, crawl_delay, robots_default_rps)
SELECT :domain,
       (SELECT max(r.crawl_delay) FROM scraping.robots r
        WHERE r.domain = :domain AND r.state = 'rules' AND r.expires_at > now()),
       :default_rps
ON CONFLICT (domain) DO UPDATE
SET crawl_delay = EXCLUDED.crawl_delay,
    robots_default_rps = EXCLUDED.robots_default_rps,
    rps = d.rps,
    updated_at = now()
WHERE d.crawl_delay IS DISTINCT FROM EXCLUDED.crawl_delay
   OR d.robots_default_rps IS DISTINCT FROM EXCLUDED.robots_default_rps

-- name: set_robots_mode
-- An operator's exemption of a host (`pin scraping domain robots`), with who and why.
INSERT INTO scraping.domains AS d (domain, robots_mode, robots_reason, robots_set_by,
                                   robots_set_at)
VALUES (:domain, :mode, :reason, :set_by, now())
ON CONFLICT (domain) DO UPDATE
SET robots_mode = EXCLUDED.robots_mode,
    robots_reason = EXCLUDED.robots_reason,
    robots_set_by = EXCLUDED.robots_set_by,
    robots_set_at = EXCLUDED.robots_set_at,
    updated_at = now()
RETURNING domain, robots_mode, robots_reason, robots_set_by, robots_set_at

-- name: lift_robots_pause
-- An exempted host's pause is lifted when its unreachable robots.txt set it (the pause
-- ends at the robots.txt's next try, within a second); a longer one is an operator's or
-- the host's Retry-After, and stands.
SELECT scraping.resume_domain(d.domain)
FROM scraping.domains d
WHERE d.domain = :domain AND d.blocked_until > now()
  AND EXISTS (SELECT 1 FROM scraping.robots r
              WHERE r.domain = d.domain AND r.state = 'unreachable'
                AND r.expires_at >= d.blocked_until - interval '1 second')

-- name: list_robots
-- Every origin's robots.txt as stored, for operators (`pin scraping domain list`).
SELECT origin, domain, state, http_status, crawl_delay, fetched_at, expires_at, failures,
       last_error, lease_owner, lease_expires_at > now() AS being_fetched
FROM scraping.robots
WHERE CAST(:domain AS text) IS NULL OR domain = CAST(:domain AS text)
ORDER BY origin
