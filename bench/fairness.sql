-- Queries of bench/fairness.py.

-- name: submit_backlog
-- The whole backlog accepted at once, in a shuffled order: :counts[i] jobs of tenant
-- :tenant_ids[i], accept times one microsecond apart in that order (so FIFO serves them
-- in the order they came, and the fair tags are given in that order too); job n's URL is
-- :base_url/n:query.
INSERT INTO scraping.jobs (id, tenant_id, url, domain, created_at, next_attempt_at)
SELECT gen_random_uuid(), s.tenant_id, :base_url || '/' || s.n || :query, :domain,
       now() - interval '1 second' + s.seq * interval '1 microsecond',
       now() - interval '1 second' + s.seq * interval '1 microsecond'
FROM (
    SELECT t.tenant_id, g.n, row_number() OVER (ORDER BY random()) AS seq
    FROM unnest(CAST(:tenant_ids AS uuid[]), CAST(:counts AS integer[])) AS t(tenant_id, n_jobs),
         generate_series(1, t.n_jobs) AS g(n)
) s
ORDER BY s.seq

-- name: job_starts
-- Per job: its tenant, when it was accepted and when its first attempt started (NULL: not
-- yet), in seconds since the epoch on the database's clock.
SELECT tenant_id, EXTRACT(EPOCH FROM created_at)::float8 AS accepted,
       EXTRACT(EPOCH FROM started_at)::float8 AS started
FROM scraping.jobs

-- name: clock
SELECT EXTRACT(EPOCH FROM clock_timestamp())::float8

-- name: submit_one
-- One job accepted now (the trickle of a quiet tenant while the heavy one is backlogged).
INSERT INTO scraping.jobs (id, tenant_id, url, domain, created_at, next_attempt_at)
VALUES (gen_random_uuid(), :tenant_id, :url, :domain, now(), now())
