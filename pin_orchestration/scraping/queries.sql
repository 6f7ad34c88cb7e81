-- The scraping service's queries (the jobs repository: the only code that touches
-- scraping.* tables). Parameters are bound, never formatted in.

-- name: create_tenant
INSERT INTO scraping.tenants (id, name, api_key_sha256, api_key_prefix)
VALUES (:id, :name, :api_key_sha256, :api_key_prefix)
ON CONFLICT (name) DO NOTHING
RETURNING id, name, created_at

-- name: list_tenants
SELECT t.id, t.name, t.api_key_prefix, t.created_at, t.key_rotated_at, t.weight,
       (SELECT count(*) FROM scraping.jobs j WHERE j.tenant_id = t.id) AS jobs
FROM scraping.tenants t
ORDER BY t.name

-- name: rotate_tenant_key
UPDATE scraping.tenants
SET api_key_sha256 = :api_key_sha256, api_key_prefix = :api_key_prefix, key_rotated_at = now()
WHERE name = :name
RETURNING id, name

-- name: tenant_by_key
SELECT id, name, api_key_sha256 FROM scraping.tenants WHERE api_key_sha256 = :api_key_sha256

-- name: tenant_by_name
SELECT id, name FROM scraping.tenants WHERE name = :name

-- name: set_job_timeouts
-- Jobs' own fetch timeouts, set in their intake's transaction (repository._set_timeouts).
UPDATE scraping.jobs j
SET timeout_seconds = t.seconds
FROM unnest(CAST(:ids AS uuid[]), CAST(:seconds AS double precision[])) AS t(id, seconds)
WHERE j.id = t.id AND j.timeout_seconds IS NULL

-- name: forget_expired_idempotency_keys
-- submit_job's forgetting of a key past its 24 h, for the keys of the jobs submitted.
UPDATE scraping.jobs
SET idempotency_key = NULL
WHERE tenant_id = :tenant_id AND idempotency_key = ANY(CAST(:keys AS text[]))
  AND created_at < now() - make_interval(secs => :ttl_seconds)

-- name: insert_jobs
-- submit_job for a batch, in one statement: the same columns, the same fingerprint of a
-- job with a key (scraping.request_sha256) and the same conflict rule (a key already
-- taken, by an earlier request or an earlier job of the batch, yields no row; the caller
-- reads the winner). The fair tags are reserved a run per class (scraping.take_fair_tags,
-- classes in name order: the lock order of the tenant's tenant_vtimes rows), the k-th job
-- of a class taking the run's k-th tag, as k jobs submitted one by one would; the domain
-- queues come from the insert's statement trigger. Rows in the batch's order.
-- A job without a key gets no fingerprint: only a reused key's body is ever compared, and
-- 400 of them were ~3 ms of the statement. One row answers: the inserted jobs that have a
-- key (a job without one cannot conflict: it is inserted, so new and queued); 400 rows
-- back cost the caller ~2.5 ms of Python.
WITH batch AS (
    SELECT j.*, (row_number() OVER (PARTITION BY j.priority ORDER BY j.ord) - 1)::integer AS k
    FROM jsonb_to_recordset(CAST(:jobs AS jsonb)) AS j(
        ord integer, id uuid, url text, domain text, params jsonb, priority text,
        callback_url text, idempotency_key text
    )
),
tags AS MATERIALIZED (
    SELECT c.priority, t.k, t.fair_tag
    FROM (SELECT b.priority, count(*)::integer AS jobs FROM batch b
          GROUP BY b.priority ORDER BY b.priority) c,
         LATERAL scraping.take_fair_tags(:tenant_id, c.priority, c.jobs) t
),
inserted AS (
INSERT INTO scraping.jobs (
    id, tenant_id, url, domain, params, priority, callback_url, idempotency_key,
    request_sha256, fair_tag
)
SELECT b.id, :tenant_id, b.url, b.domain, b.params, b.priority, b.callback_url,
       b.idempotency_key,
       CASE WHEN b.idempotency_key IS NOT NULL
            THEN scraping.request_sha256(b.url, b.params, b.priority, b.callback_url) END,
       t.fair_tag
FROM batch b
JOIN tags t ON t.priority = b.priority AND t.k = b.k
ORDER BY b.ord
ON CONFLICT (tenant_id, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING
RETURNING id, idempotency_key
)
SELECT coalesce(array_agg(id) FILTER (WHERE idempotency_key IS NOT NULL), '{}') AS keyed_ids
FROM inserted

-- name: jobs_by_idempotency_keys
-- For each job of a batch that was not inserted: the job holding its key, and whether
-- that job was made from the same request body.
SELECT r.ord, j.id, j.status,
       j.request_sha256 = scraping.request_sha256(r.url, r.params, r.priority, r.callback_url)
           AS same_body
FROM jsonb_to_recordset(CAST(:jobs AS jsonb)) AS r(
    ord integer, url text, params jsonb, priority text, callback_url text,
    idempotency_key text
)
JOIN scraping.jobs j ON j.tenant_id = :tenant_id AND j.idempotency_key = r.idempotency_key
WHERE r.ord = ANY(CAST(:ords AS integer[]))

-- name: remembered_job_by_idempotency_key
-- A key is remembered for a documented period (IDEMPOTENCY_KEY_TTL, submit_job's 24 h).
SELECT id, status,
       request_sha256 = scraping.request_sha256(
           :url, CAST(:params AS jsonb), :priority, :callback_url) AS same_body
FROM scraping.jobs
WHERE tenant_id = :tenant_id AND idempotency_key = :idempotency_key
  AND created_at >= now() - make_interval(secs => :ttl_seconds)

-- name: get_job
SELECT id, tenant_id, url, params, priority, callback_url, status, attempts, last_error,
       last_error_class, next_attempt_at, created_at, started_at, finished_at,
       result_key, result_size, result_sha256, result_content_type, result_expired_at,
       updated_at, timeout_seconds
FROM scraping.jobs
WHERE id = :id AND tenant_id = :tenant_id

-- name: list_jobs
-- Keyset on id descending (UUIDv7: newest first), one index range per page.
SELECT id, tenant_id, url, params, priority, callback_url, status, attempts, last_error,
       last_error_class, next_attempt_at, created_at, started_at, finished_at,
       result_key, result_size, result_sha256, result_content_type, timeout_seconds
FROM scraping.jobs
WHERE tenant_id = :tenant_id
  AND (CAST(:status AS text) IS NULL OR status = CAST(:status AS text))
  AND (CAST(:before_id AS uuid) IS NULL OR id < CAST(:before_id AS uuid))
ORDER BY id DESC
LIMIT :limit

-- name: list_attempts
SELECT number, started_at, finished_at, outcome, http_status, error_class, error_detail,
       duration_ms
FROM scraping.job_attempts
WHERE job_id = :job_id
ORDER BY number

-- name: cancel_job
-- queued → cancelled at once; running → cancel requested, the worker stops at its next
-- check. Returns the status after the call (no row: not this tenant's job).
UPDATE scraping.jobs
SET status = CASE WHEN status = 'queued' THEN 'cancelled' ELSE status END,
    finished_at = CASE WHEN status = 'queued' THEN now() ELSE finished_at END,
    cancel_requested_at = CASE WHEN status = 'running' THEN coalesce(cancel_requested_at, now())
                               ELSE cancel_requested_at END,
    updated_at = now()
WHERE id = :id AND tenant_id = :tenant_id AND status IN ('queued', 'running')
RETURNING id, status

-- name: queue_stats
-- One cheap query for the sensor: due depth, oldest due age, and what of it a worker could
-- claim now, by the claim's rules — due jobs on domains not paused and below their
-- concurrency, each domain counted up to its free connections (its running jobs and the
-- redirect hops holding one taken) and to the tokens its bucket holds — with the oldest
-- claimable job's wait. A recursive
-- skip scan walks the distinct queued domains (ix_jobs_queued_domain), a few index probes
-- each; nothing scans the jobs of a busy domain.
WITH RECURSIVE queued_domains(name) AS (
    (SELECT domain FROM scraping.jobs WHERE status = 'queued' ORDER BY domain LIMIT 1)
    UNION ALL
    SELECT (SELECT j.domain FROM scraping.jobs j
            WHERE j.status = 'queued' AND j.domain > q.name
            ORDER BY j.domain LIMIT 1)
    FROM queued_domains q WHERE q.name IS NOT NULL
), room AS (
    SELECT q.name,
           greatest(head.due_at, d.blocked_until) AS claimable_since,
           least(
               coalesce(d.concurrency, :default_concurrency)
                 - (SELECT count(*) FROM scraping.jobs r
                    WHERE r.status = 'running' AND r.domain = q.name)
                 - (SELECT count(*) FROM scraping.redirect_slots s
                    WHERE s.domain = q.name AND s.expires_at > now()),
               CAST(floor(scraping.domain_tokens(
                   d, coalesce(d.rps, :default_rps), clock_timestamp())) AS bigint)) AS free
    FROM queued_domains q
    CROSS JOIN LATERAL (
        SELECT j.next_attempt_at AS due_at FROM scraping.jobs j
        WHERE j.status = 'queued' AND j.domain = q.name
        ORDER BY j.next_attempt_at LIMIT 1) head
    LEFT JOIN scraping.domains d ON d.domain = q.name
    WHERE q.name IS NOT NULL
      AND head.due_at <= now()
      AND (d.blocked_until IS NULL OR d.blocked_until <= now())
), claimable AS (
    SELECT room.claimable_since, (
               SELECT count(*) FROM (
                   SELECT 1 FROM scraping.jobs j
                   WHERE j.status = 'queued' AND j.domain = room.name
                     AND j.next_attempt_at <= now()
                   LIMIT room.free) AS due_here) AS jobs
    FROM room
    WHERE room.free > 0
), totals AS (
    SELECT
        count(*) FILTER (WHERE next_attempt_at <= now()) AS due,
        count(*) AS queued,
        min(next_attempt_at) AS next_due_at,
        EXTRACT(EPOCH FROM now() - min(next_attempt_at) FILTER (
            WHERE next_attempt_at <= now())) AS oldest_due_age_seconds
    FROM scraping.jobs
    WHERE status = 'queued'
)
SELECT totals.*,
       (SELECT coalesce(sum(jobs), 0) FROM claimable) AS claimable,
       (SELECT EXTRACT(EPOCH FROM now() - min(claimable_since)) FROM claimable
        WHERE jobs > 0) AS oldest_claimable_age_seconds
FROM totals

-- name: claim_due_jobs
-- The pick (priority -> tenant -> domain with room -> oldest due) is the PL/pgSQL function
-- scraping.claim_jobs (migration 0007, its plan explained there): one round trip, one
-- short transaction, a batch of up to :limit jobs.
SELECT id, tenant_id, url, domain, priority, params, attempts,
       attempts - attempts_before_requeue - robots_waits AS budget_used, created_at,
       timeout_seconds, lease_expires_at - make_interval(secs => :lease_seconds) AS claimed_at
FROM scraping.claim_jobs(
    :worker, :limit, :lease_seconds, :default_rps, :default_concurrency)

-- name: take_redirect_slot
-- A redirect hop's place on its host (0: go; else seconds to wait), see
-- scraping/sql/redirect_slots.sql.
SELECT scraping.take_redirect_slot(
    :job_id, :attempt, :host, :hold_seconds, :default_rps, :default_concurrency) AS wait

-- name: release_redirect_slot
SELECT scraping.release_redirect_slot(:job_id, :attempt)

-- name: renew_leases
-- Extend this worker's leases of these attempts; an attempt missing from the answer is no
-- longer ours (swept, finished elsewhere, or the job claimed again: a later attempt, even
-- of this worker, is not renewed on an earlier one's behalf). Cancel requests ride back on
-- the same round trip.
UPDATE scraping.jobs j
SET lease_expires_at = now() + make_interval(secs => :lease_seconds)
FROM unnest(CAST(:ids AS uuid[]), CAST(:numbers AS integer[])) AS r(id, number)
WHERE j.id = r.id AND j.attempts = r.number AND j.status = 'running'
  AND j.lease_owner = :worker
RETURNING j.id, j.attempts, j.cancel_requested_at IS NOT NULL AS cancel_requested

-- name: finish_attempts
-- The attempts' outcomes (one domain's of a round, one statement) and their jobs' next
-- states, each written only while the lease is still that attempt's (status running,
-- owner and attempt number match): a swept and re-claimed job is never overwritten by a
-- late worker. A cancel requested while the attempt ran wins over whatever it ended with
-- (a retry, a failure, even a success): the job ends cancelled and keeps no result; the
-- caller deletes the object it stored. The SET reads the row as it is when the UPDATE
-- gets its lock, so a cancel committed first is seen. One row back per job written.
WITH o AS (
    SELECT *
    FROM unnest(
        CAST(:job_ids AS uuid[]), CAST(:attempts AS integer[]), CAST(:statuses AS text[]),
        CAST(:next_attempt_in AS double precision[]), CAST(:robots_waits AS boolean[]),
        CAST(:last_errors AS text[]), CAST(:error_classes AS text[]),
        CAST(:result_keys AS text[]), CAST(:result_sizes AS bigint[]),
        CAST(:result_sha256s AS text[]), CAST(:result_content_types AS text[]),
        CAST(:outcomes AS text[]), CAST(:http_statuses AS integer[]),
        CAST(:error_details AS text[]), CAST(:durations_ms AS integer[])
    ) AS o(job_id, attempt, status, next_attempt_in, robots_wait, last_error, error_class,
           result_key, result_size, result_sha256, result_content_type, outcome,
           http_status, error_detail, duration_ms)
),
job AS (
    UPDATE scraping.jobs j
    SET status = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled' ELSE o.status END,
        next_attempt_at = coalesce(
            now() + make_interval(secs => o.next_attempt_in), j.next_attempt_at),
        lease_owner = NULL,
        lease_expires_at = NULL,
        -- an attempt that only waited on robots.txt (nothing sent) is not spent (0037)
        robots_waits = j.robots_waits + CASE WHEN o.robots_wait THEN 1 ELSE 0 END,
        last_error = CASE WHEN j.cancel_requested_at IS NOT NULL
                          THEN 'cancelled by the client while running'
                          ELSE o.last_error END,
        last_error_class = CASE WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
                                ELSE o.error_class END,
        result_key = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.result_key
                          ELSE coalesce(o.result_key, j.result_key) END,
        result_size = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.result_size
                           ELSE coalesce(o.result_size, j.result_size) END,
        result_sha256 = CASE WHEN j.cancel_requested_at IS NOT NULL THEN j.result_sha256
                             ELSE coalesce(o.result_sha256, j.result_sha256) END,
        result_content_type = CASE WHEN j.cancel_requested_at IS NOT NULL
                                   THEN j.result_content_type
                                   ELSE coalesce(o.result_content_type,
                                                 j.result_content_type) END,
        finished_at = CASE WHEN j.cancel_requested_at IS NOT NULL
                             OR o.status IN ('succeeded', 'failed', 'cancelled') THEN now()
                           ELSE j.finished_at END,
        updated_at = now()
    FROM o
    WHERE j.id = o.job_id AND j.status = 'running' AND j.lease_owner = :worker
      AND j.attempts = o.attempt
    RETURNING j.id, j.status, o.attempt, o.outcome, o.http_status, o.error_class,
              o.error_detail, o.duration_ms
)
UPDATE scraping.job_attempts a
SET finished_at = now(),
    outcome = job.outcome,
    http_status = job.http_status,
    error_class = job.error_class,
    error_detail = job.error_detail,
    duration_ms = job.duration_ms
FROM job
WHERE a.job_id = job.id AND a.number = job.attempt
RETURNING a.job_id, job.status

-- name: attempts_written
-- Which of these attempts have their outcome written (not swept as lost), with their job's
-- status: a worker whose finish was refused learns that an earlier write of its own landed.
SELECT a.job_id, a.number, j.status
FROM unnest(CAST(:job_ids AS uuid[]), CAST(:numbers AS integer[])) AS w(job_id, number)
JOIN scraping.job_attempts a ON a.job_id = w.job_id AND a.number = w.number
JOIN scraping.jobs j ON j.id = a.job_id
WHERE a.outcome IS NOT NULL AND a.outcome <> 'lost'

-- name: set_max_pause
-- The cap scraping.pause_domain applies in this transaction (PIN_SCRAPING_MAX_PAUSE_SECONDS).
SELECT set_config('pin.scraping_max_pause_seconds', CAST(:seconds AS text), true)

-- name: set_pause_cause
-- Who pauses in this transaction (trigger domains_pause_cause): an operator.
SELECT set_config('pin.scraping_pause_cause', 'operator', true)

-- name: pause_domains
-- A 429 or Retry-After from a domain: no worker sends it anything for :paused_for seconds
-- (from the database's clock), through scraping.pause_domain (capped; a longer pause
-- already set stands). Written before the round's outcomes, one domain a transaction, in
-- name order: two workers pausing the same domains queue, and the tenant rows its trigger
-- parks are held only to that commit.
SELECT scraping.pause_domain(p.domain, now() + make_interval(secs => p.seconds))
FROM (
    SELECT u.domain, u.seconds
    FROM unnest(CAST(:domains AS text[]), CAST(:paused_for AS double precision[]))
        AS u(domain, seconds)
    ORDER BY u.domain
    OFFSET 0
) p

-- name: pause_domain
SELECT scraping.pause_domain(:domain, now() + make_interval(secs => :seconds)) AS until

-- name: resume_domain
SELECT scraping.resume_domain(:domain) AS was_paused

-- name: set_domain_limits
-- NULL keeps what is set (the default when nothing is). The operator's rate is
-- configured_rps; rps, what the claim enforces, is derived from it and the host's
-- robots.txt Crawl-delay (trigger domains_effective_rps, scraping/sql/robots.sql).
INSERT INTO scraping.domains AS d (domain, configured_rps, concurrency)
VALUES (:domain, :rps, :concurrency)
ON CONFLICT (domain) DO UPDATE
SET configured_rps = coalesce(EXCLUDED.configured_rps, d.configured_rps),
    concurrency = coalesce(EXCLUDED.concurrency, d.concurrency),
    updated_at = now()
RETURNING domain, rps, concurrency

-- name: clear_domain_limits
UPDATE scraping.domains
SET configured_rps = NULL, concurrency = NULL, updated_at = now()
WHERE domain = :domain
RETURNING domain

-- name: list_domains
-- Domains with an override, a pause, or queued or running jobs.
WITH busy AS (
    SELECT domain,
           count(*) FILTER (WHERE status = 'queued') AS queued,
           count(*) FILTER (WHERE status = 'running') AS running
    FROM scraping.jobs
    WHERE status IN ('queued', 'running')
    GROUP BY domain
)
SELECT coalesce(d.domain, b.domain) AS domain, d.rps, d.concurrency,
       CASE WHEN d.blocked_until > now() THEN d.blocked_until END AS blocked_until,
       coalesce(b.queued, 0) AS queued, coalesce(b.running, 0) AS running,
       d.configured_rps, d.crawl_delay, d.robots_mode, d.robots_reason, d.robots_set_by
FROM scraping.domains d
FULL JOIN busy b ON b.domain = d.domain
WHERE d.rps IS NOT NULL OR d.concurrency IS NOT NULL OR d.blocked_until > now()
   OR d.robots_mode IS NOT NULL OR b.domain IS NOT NULL
ORDER BY 1

-- name: set_tenant_weight
UPDATE scraping.tenants SET weight = :weight WHERE name = :name
RETURNING id, name, weight

-- name: sweep_expired_leases
-- Jobs whose worker stopped renewing: back to queued (or failed once attempts are spent,
-- cancelled when a cancel was asked), the lost attempt recorded.
WITH expired AS (
    SELECT id
    FROM scraping.jobs
    WHERE status = 'running' AND lease_expires_at < now()
    ORDER BY lease_expires_at
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
), swept AS (
    UPDATE scraping.jobs j
    SET status = CASE
            WHEN j.cancel_requested_at IS NOT NULL THEN 'cancelled'
            WHEN j.attempts - j.attempts_before_requeue - j.robots_waits >= :max_attempts THEN 'failed'
            ELSE 'queued' END,
        next_attempt_at = now(),
        lease_owner = NULL,
        lease_expires_at = NULL,
        last_error = 'lease expired: the worker stopped renewing (killed or stalled)',
        last_error_class = 'lease_expired',
        finished_at = CASE
            WHEN j.cancel_requested_at IS NOT NULL OR j.attempts - j.attempts_before_requeue - j.robots_waits >= :max_attempts THEN now()
            ELSE NULL END,
        updated_at = now()
    FROM expired
    WHERE j.id = expired.id
    RETURNING j.id, j.attempts, j.status
), lost AS (
    UPDATE scraping.job_attempts a
    SET finished_at = now(), outcome = 'lost', error_class = 'lease_expired',
        error_detail = 'lease expired before the attempt finished'
    FROM swept
    WHERE a.job_id = swept.id AND a.number = swept.attempts AND a.outcome IS NULL
)
SELECT id, attempts, status FROM swept

-- name: delete_lapsed_redirect_slots
-- Redirect slots past their hold (a worker killed mid-hop never released its slot): the
-- claim already ignores them; nothing else deletes them. Rows another transaction holds
-- (a hop being released) are left to it.
DELETE FROM scraping.redirect_slots s
USING (
    SELECT job_id, attempt FROM scraping.redirect_slots
    WHERE expires_at < now()
    LIMIT :limit
    FOR UPDATE SKIP LOCKED
) lapsed
WHERE s.job_id = lapsed.job_id AND s.attempt = lapsed.attempt

-- name: expired_lease_jobs
-- The jobs the next sweep takes (those whose lease ran out longest ago), and their domains.
SELECT j.id, j.domain FROM scraping.jobs j
WHERE j.status = 'running' AND j.lease_expires_at < now()
ORDER BY j.lease_expires_at
LIMIT :limit

-- name: failed_job_domains
SELECT DISTINCT j.domain FROM scraping.jobs j
WHERE j.id = ANY(CAST(:ids AS uuid[])) AND j.status = 'failed'

-- name: lock_fair_tag_rows
-- The fair-tag rows (class × tenant) of these jobs, locked in one order by a statement or
-- round that may send jobs of several tenants back to the queue: each requeue takes its
-- tenant's next tag under that row's lock (scraping.take_fair_tags) before it touches its
-- domain's queue, and two rounds whose tenants cross deadlocked. Everywhere: these rows
-- first, then the domain queues (lock_domain_queues, or writes in domain order).
SELECT 1 FROM scraping.tenant_vtimes v
WHERE (v.priority, v.tenant_id) IN (
    SELECT j.priority, j.tenant_id FROM scraping.jobs j
    WHERE j.id = ANY(CAST(:ids AS uuid[])))
ORDER BY v.priority, v.tenant_id
FOR NO KEY UPDATE

-- name: lock_domain_queues
-- The queue rows of these domains, locked in domain order, by a statement about to change
-- jobs of several domains at once (the sweeper, the requeue runbook): its triggers would
-- lock them in whatever order it meets the jobs, and deadlock with a worker's outcome
-- round, which locks them in domain order.
SELECT 1 FROM scraping.domain_queues q
WHERE q.domain = ANY(CAST(:domains AS text[]))
ORDER BY q.domain, q.priority
FOR NO KEY UPDATE

-- name: list_failed_jobs
SELECT j.id, t.name AS tenant, j.url, j.attempts, j.last_error_class, j.last_error,
       j.finished_at
FROM scraping.jobs j JOIN scraping.tenants t ON t.id = j.tenant_id
WHERE j.status = 'failed'
ORDER BY j.finished_at DESC, j.id
LIMIT :limit

-- name: requeue_failed_jobs
-- Runbook: put failed jobs back with a fresh attempt budget.
UPDATE scraping.jobs
SET status = 'queued', attempts_before_requeue = attempts, robots_waits = 0,
    next_attempt_at = now(), finished_at = NULL,
    -- Its next finish is announced again (from attempt 1).
    finish_published_at = NULL, webhook_attempts = 0, webhook_next_attempt_at = NULL,
    -- Its new attempts' objects are swept again once it ends.
    cancel_requested_at = NULL, attempt_objects_swept_at = NULL, updated_at = now()
WHERE id = ANY(CAST(:ids AS uuid[])) AND status = 'failed'
RETURNING id

-- name: give_back_intake_tokens
-- Tokens taken for jobs a grouped POST /jobs did not store (a key reused with another
-- body: that request stores nothing, so it spends nothing), in the taking transaction.
UPDATE scraping.intake_buckets
SET tokens = LEAST(CAST(:burst AS double precision), tokens + :jobs)
WHERE tenant_id = :tenant_id

-- name: take_intake_token
-- The per-tenant intake limit (migration 0010): refill the tenant's bucket by the time
-- elapsed since its last refill (capped at the burst) and take :jobs tokens (one per job
-- submitted: a batch of 400 takes 400) if there are that many,
-- in one statement whose row lock serialises the API processes. Time is PostgreSQL's
-- clock, the same for every process. A refused request writes nothing (the DO UPDATE's
-- WHERE is false): `taken` is then NULL and `level` is the bucket read from the
-- statement's snapshot, from which the caller tells the client how long to wait.
WITH now AS (SELECT clock_timestamp() AS t),
taken AS (
    INSERT INTO scraping.intake_buckets AS b (tenant_id, tokens, refilled_at)
    SELECT :tenant_id, CAST(:burst AS double precision) - :jobs, now.t FROM now
    ON CONFLICT (tenant_id) DO UPDATE
    SET tokens = LEAST(
            CAST(:burst AS double precision),
            b.tokens + CAST(:rps AS double precision) * GREATEST(
                0, extract(epoch FROM EXCLUDED.refilled_at - b.refilled_at)::double precision
            )
        ) - :jobs,
        refilled_at = GREATEST(b.refilled_at, EXCLUDED.refilled_at)
    WHERE LEAST(
            CAST(:burst AS double precision),
            b.tokens + CAST(:rps AS double precision) * GREATEST(
                0, extract(epoch FROM EXCLUDED.refilled_at - b.refilled_at)::double precision
            )
        ) >= :jobs
    RETURNING b.tokens
)
SELECT
    (SELECT tokens FROM taken) AS taken,
    (
        SELECT LEAST(
            CAST(:burst AS double precision),
            b.tokens + CAST(:rps AS double precision) * GREATEST(
                0, extract(epoch FROM now.t - b.refilled_at)::double precision
            )
        )
        FROM scraping.intake_buckets b, now
        WHERE b.tenant_id = :tenant_id
    ) AS level
