-- Queries of chessboard project-aggregates-recalc (seed 002).
--
-- Every aggregate is a pure function of chessboard.property_objects / chessboard.layouts:
--   free object   = deleted_at IS NULL AND status = 'Free'
--   active object = deleted_at IS NULL AND status <> 'Hidden'
--   live layout   = deleted_at IS NULL
-- Empty sets give NULL prices/areas and 0 counts. Each recalc_* statement aggregates one
-- project's slice, updates only rows whose stored values differ (IS DISTINCT FROM), bumps
-- their version and updated_at and returns the changed ids; write_snapshot_events then
-- writes their snapshot events to the outbox — all inside the caller's per-project
-- transaction.

-- ---------------------------------------------------------------------------------------
-- Debounce queue (AGG-1, AGG-2, AGG-6)

-- Trailing debounce with the starvation cap, in the SQL function that other services call
-- too (migration 0005): here with the caller's clock and policy.
-- name: request_recalc
SELECT chessboard.request_project_recalc_at(
           CAST(:project_id AS uuid), CAST(:tenant_id AS uuid), CAST(:reason AS text),
           coalesce(CAST(:now AS timestamptz), now()),
           CAST(:debounce_seconds AS double precision), CAST(:cap_seconds AS double precision)
       ) AS due_at

-- Runbook "force recalc": make the project's row due now (insert it if absent).
-- name: force_due_now
INSERT INTO chessboard.project_recalc_requests AS r (
    project_id, tenant_id, due_at, first_requested_at, requested_count, last_reason,
    attempt_count, created_at, updated_at
)
SELECT p.id, coalesce(p.tenant_id, CAST(:unknown_tenant AS uuid)), clock.now, clock.now, 1,
       :reason, 0, clock.now, clock.now
FROM chessboard.projects AS p,
     (SELECT coalesce(CAST(:now AS timestamptz), now()) AS now) AS clock
WHERE p.id = :project_id
ON CONFLICT (project_id) DO UPDATE
SET due_at = excluded.due_at,
    requested_count = r.requested_count + 1,
    last_reason = excluded.last_reason,
    updated_at = excluded.updated_at
RETURNING project_id

-- Runbook "reset a poison row": attempts back to 0, due now.
-- name: reset_poison
UPDATE chessboard.project_recalc_requests
SET attempt_count = 0, last_error = NULL, not_before = NULL,
    due_at = coalesce(CAST(:now AS timestamptz), now()), updated_at = now()
WHERE project_id = :project_id
RETURNING project_id, attempt_count

-- A drain claims the oldest claimable row by committing a lease on it (a short transaction
-- of its own): the recalc then runs without holding the row, so a raiser's upsert never
-- waits for it. claimable_at = greatest(due_at, not_before, claimed_until): a row leased by
-- another drain, or backing off after a failure, is not claimable; an expired lease (a
-- killed drain) is. Poison rows are left for manual handling. SKIP LOCKED: a row another
-- drain is claiming right now is skipped, not waited for.
--
-- The claim commits without waiting for the WAL flush (set_config: no extra round trip):
-- a crash can lose it only with everything logged after it, and a lost lease costs at most
-- a redundant recalc, never a lost request.
-- name: claim_next_due
UPDATE chessboard.project_recalc_requests AS r
SET claimed_until = clock.now + make_interval(secs => :lease_seconds),
    claim_token = :token
FROM (
    SELECT coalesce(CAST(:now AS timestamptz), now()) AS now,
           set_config('synchronous_commit', 'off', true) AS commit_mode
) AS clock
WHERE r.project_id = (
    SELECT project_id
    FROM chessboard.project_recalc_requests
    WHERE claimable_at <= coalesce(CAST(:now AS timestamptz), now())
      AND attempt_count < :poison_threshold
    ORDER BY claimable_at
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
RETURNING r.project_id, r.tenant_id, r.due_at, r.updated_at, r.requested_count,
          r.last_reason, r.attempt_count, r.claim_token, clock.now AS claimed_at

-- The end of the recalc's transaction: the request is done unless it was raised again
-- meanwhile (the raise upsert bumps requested_count and updated_at and moves due_at) —
-- then the row stays, unleased, for one more recalc (as release_claim). SKIP LOCKED: a
-- raiser's transaction holding the row is never waited for while the recalc holds its
-- project's locks (that wait is what deadlocked); `handled` false sends the drain to
-- finish_claim after the commit.
-- name: finish_claim_in_recalc
WITH mine AS (
    SELECT project_id,
           (requested_count, updated_at, due_at)
               = (:requested_count, CAST(:updated_at AS timestamptz),
                  CAST(:due_at AS timestamptz)) AS served
    FROM chessboard.project_recalc_requests
    WHERE project_id = :project_id AND claim_token = :token
    FOR UPDATE SKIP LOCKED
),
done AS (
    DELETE FROM chessboard.project_recalc_requests AS r
    USING mine
    WHERE r.project_id = mine.project_id AND mine.served
    RETURNING r.project_id
),
released AS (
    UPDATE chessboard.project_recalc_requests AS r
    SET claimed_until = NULL, claim_token = NULL,
        requested_count = greatest(r.requested_count - :requested_count, 1),
        first_requested_at = greatest(r.first_requested_at, :claimed_at)
    FROM mine
    WHERE r.project_id = mine.project_id AND NOT mine.served
    RETURNING r.project_id
)
SELECT EXISTS (SELECT FROM done) AS deleted, EXISTS (SELECT FROM released) AS released

-- After the recalc committed, when the row was held at its end (or for a forced recalc):
-- the same decision, waiting for the raiser's commit — the drain holds no other lock now.
-- The lease passed to another drain: the row is left alone. `token` NULL: a forced
-- recalc of an unclaimed row. Committed without waiting for the flush: a lost delete
-- costs one redundant recalc.
-- name: finish_claim
DELETE FROM chessboard.project_recalc_requests
USING (SELECT set_config('synchronous_commit', 'off', true)) AS commit_mode
WHERE project_id = :project_id
  AND claim_token IS NOT DISTINCT FROM CAST(:token AS uuid)
  AND requested_count = :requested_count
  AND updated_at = :updated_at
  AND due_at = :due_at
RETURNING project_id

-- Raised again during the recalc: the row stays for one more recalc, due as the raises
-- set it, counting only the requests since the claim, its starvation window opened at the
-- claim (what the recalc already covered).
-- name: release_claim
UPDATE chessboard.project_recalc_requests
SET claimed_until = NULL, claim_token = NULL,
    requested_count = greatest(requested_count - :requested_count, 1),
    first_requested_at = greatest(first_requested_at, :claimed_at)
WHERE project_id = :project_id AND claim_token = :token
RETURNING project_id

-- The force-recalc path reads the project's queue row (no lock: the recalc runs without it).
-- name: read_request
SELECT project_id, tenant_id, due_at, updated_at, requested_count, last_reason,
       attempt_count, claim_token, now() AS claimed_at
FROM chessboard.project_recalc_requests
WHERE project_id = :project_id

-- Written after the recalc rolled back, if this drain still holds the lease: the row stays
-- due (due_at unchanged) but no drain retries it before `retry_after` has passed.
-- name: record_failure
UPDATE chessboard.project_recalc_requests
SET attempt_count = attempt_count + 1, last_error = :error,
    not_before = coalesce(CAST(:now AS timestamptz), now())
                 + make_interval(secs => :retry_after_seconds),
    claimed_until = NULL, claim_token = NULL, updated_at = now()
WHERE project_id = :project_id AND claim_token = :token
RETURNING attempt_count

-- After a recalc rolled back on a row lock a raiser held (a conflict, not a failure): the
-- lease is given back and the project waits `retry_after` — the raiser's transaction is
-- short, and its raise, if any, moves due_at further — with attempt_count untouched.
-- name: defer_claim
UPDATE chessboard.project_recalc_requests
SET not_before = coalesce(CAST(:now AS timestamptz), now())
                 + make_interval(secs => :retry_after_seconds),
    claimed_until = NULL, claim_token = NULL
WHERE project_id = :project_id AND claim_token = :token
RETURNING project_id

-- What the sensor needs to decide whether to launch drain runs: cheap aggregates only.
-- name: queue_stats
SELECT count(*) AS depth,
       count(*) FILTER (
           WHERE claimable_at <= coalesce(CAST(:now AS timestamptz), now())
             AND attempt_count < :poison_threshold
       ) AS due,
       count(*) FILTER (WHERE attempt_count >= :poison_threshold) AS poison,
       min(claimable_at) FILTER (WHERE attempt_count < :poison_threshold) AS next_due_at,
       extract(epoch FROM min(claimable_at) FILTER (WHERE attempt_count < :poison_threshold)
                          - coalesce(CAST(:now AS timestamptz), now())) AS next_due_in_seconds,
       coalesce(sum(requested_count), 0) AS pending_requests,
       -- Poison rows stay due forever; they are counted by `poison`, not as backlog age.
       extract(epoch FROM coalesce(CAST(:now AS timestamptz), now())
                          - min(due_at) FILTER (WHERE attempt_count < :poison_threshold))
           AS oldest_due_age_seconds
FROM chessboard.project_recalc_requests

-- How long until the next row a worker could claim becomes claimable (negative: already;
-- NULL: none queued). Poison rows are left out like the claim leaves them out, so they
-- never make a worker wake early. Computed on the database clock, the clock the claim
-- compares claimable_at with.
-- name: seconds_until_next_due
SELECT extract(epoch FROM min(claimable_at) - coalesce(CAST(:now AS timestamptz), now()))
           AS seconds
FROM chessboard.project_recalc_requests
WHERE attempt_count < :poison_threshold

-- name: poison_rows
SELECT project_id, tenant_id, attempt_count, last_error, last_reason, first_requested_at
FROM chessboard.project_recalc_requests
WHERE attempt_count >= :poison_threshold
ORDER BY project_id

-- ---------------------------------------------------------------------------------------
-- Recalc of one project (AGG-3 .. AGG-5)

-- A recalc never waits for a row lock (issue 20): every row it updates is locked NOWAIT
-- first — the project here, the stale buildings / layouts / layout groups in each recalc_*
-- statement's `stale` step — so a raiser holding one of them, whatever else it locked and
-- in which order, makes the recalc fail at once (55P03, rolled back whole, the project
-- retried later without an attempt) instead of waiting for it while holding rows the
-- raiser may want next. The project row's lock also serializes a force recalc and a drain.
-- name: lock_project
SELECT id, tenant_id, status, deleted_at
FROM chessboard.projects
WHERE id = :project_id
FOR NO KEY UPDATE NOWAIT

-- name: recalc_project
WITH truth AS (
    SELECT min(po.price) FILTER (WHERE po.status = 'Free') AS price_min,
           max(po.price) FILTER (WHERE po.status = 'Free') AS price_max,
           count(*) FILTER (WHERE po.status <> 'Hidden') AS total_count,
           count(*) FILTER (WHERE po.status = 'Free') AS free_count
    FROM chessboard.property_objects AS po
    WHERE po.project_id = :project_id AND po.deleted_at IS NULL
),
changed AS (
    UPDATE chessboard.projects AS p
    SET price_min = t.price_min,
        price_max = t.price_max,
        property_objects_total_count = t.total_count,
        property_objects_free_count = t.free_count,
        version = p.version + 1,
        updated_at = now()
    FROM truth AS t
    WHERE p.id = :project_id
      AND (p.price_min, p.price_max, p.property_objects_total_count,
           p.property_objects_free_count)
          IS DISTINCT FROM (t.price_min, t.price_max, t.total_count, t.free_count)
    RETURNING p.id
)
SELECT t.price_min, t.price_max, t.total_count, t.free_count,
       (SELECT array_agg(id) FROM changed) AS changed_ids
FROM truth AS t

-- Building counters are updated but never published (outside the building event payload).
-- name: recalc_buildings
WITH counts AS (
    SELECT po.building_id,
           count(*) FILTER (WHERE po.status <> 'Hidden') AS total_count,
           count(*) FILTER (WHERE po.status = 'Free') AS free_count
    FROM chessboard.property_objects AS po
    WHERE po.project_id = :project_id AND po.deleted_at IS NULL
      AND po.building_id IS NOT NULL
    GROUP BY po.building_id
),
truth AS (
    SELECT b.id, coalesce(c.total_count, 0) AS total_count,
           coalesce(c.free_count, 0) AS free_count
    FROM chessboard.buildings AS b
    LEFT JOIN counts AS c ON c.building_id = b.id
    WHERE b.project_id = :project_id
),
stale AS (
    SELECT b.id
    FROM chessboard.buildings AS b
    JOIN truth AS t ON t.id = b.id
    WHERE (b.property_objects_total_count, b.property_objects_free_count)
          IS DISTINCT FROM (t.total_count, t.free_count)
    FOR NO KEY UPDATE OF b NOWAIT
),
changed AS (
    UPDATE chessboard.buildings AS b
    SET property_objects_total_count = t.total_count,
        property_objects_free_count = t.free_count,
        updated_at = now()
    FROM truth AS t
    JOIN stale AS s ON s.id = t.id
    WHERE b.id = t.id
      AND (b.property_objects_total_count, b.property_objects_free_count)
          IS DISTINCT FROM (t.total_count, t.free_count)
    RETURNING b.id
)
SELECT (SELECT count(*) FROM truth) AS rows, (SELECT count(*) FROM changed) AS changed

-- name: recalc_layouts
WITH counts AS (
    SELECT po.layout_id, count(*) AS active_count
    FROM chessboard.property_objects AS po
    WHERE po.project_id = :project_id AND po.deleted_at IS NULL
      AND po.status <> 'Hidden' AND po.layout_id IS NOT NULL
    GROUP BY po.layout_id
),
truth AS (
    SELECT l.id, coalesce(c.active_count, 0) AS active_count
    FROM chessboard.layouts AS l
    LEFT JOIN counts AS c ON c.layout_id = l.id
    WHERE l.project_id = :project_id
),
stale AS (
    SELECT l.id
    FROM chessboard.layouts AS l
    JOIN truth AS t ON t.id = l.id
    WHERE l.property_objects_count IS DISTINCT FROM t.active_count
    FOR NO KEY UPDATE OF l NOWAIT
),
changed AS (
    UPDATE chessboard.layouts AS l
    SET property_objects_count = t.active_count,
        version = l.version + 1,
        updated_at = now()
    FROM truth AS t
    JOIN stale AS s ON s.id = t.id
    WHERE l.id = t.id AND l.property_objects_count IS DISTINCT FROM t.active_count
    RETURNING l.id
)
SELECT (SELECT count(*) FROM truth) AS rows, (SELECT array_agg(id) FROM changed) AS changed_ids

-- name: recalc_layout_groups
WITH areas AS (
    SELECT l.layout_group_id, count(*) AS layouts_count,
           min(l.total_area) AS area_min, max(l.total_area) AS area_max
    FROM chessboard.layouts AS l
    WHERE l.project_id = :project_id AND l.deleted_at IS NULL
      AND l.layout_group_id IS NOT NULL
    GROUP BY l.layout_group_id
),
truth AS (
    SELECT g.id, coalesce(a.layouts_count, 0) AS layouts_count, a.area_min, a.area_max
    FROM chessboard.layout_groups AS g
    LEFT JOIN areas AS a ON a.layout_group_id = g.id
    WHERE g.project_id = :project_id
),
stale AS (
    SELECT g.id
    FROM chessboard.layout_groups AS g
    JOIN truth AS t ON t.id = g.id
    WHERE (g.layouts_count, g.area_min, g.area_max)
          IS DISTINCT FROM (t.layouts_count, t.area_min, t.area_max)
    FOR NO KEY UPDATE OF g NOWAIT
),
changed AS (
    UPDATE chessboard.layout_groups AS g
    SET layouts_count = t.layouts_count,
        area_min = t.area_min,
        area_max = t.area_max,
        version = g.version + 1,
        updated_at = now()
    FROM truth AS t
    JOIN stale AS s ON s.id = t.id
    WHERE g.id = t.id
      AND (g.layouts_count, g.area_min, g.area_max)
          IS DISTINCT FROM (t.layouts_count, t.area_min, t.area_max)
    RETURNING g.id
)
SELECT (SELECT count(*) FROM truth) AS rows, (SELECT array_agg(id) FROM changed) AS changed_ids

-- The snapshot events of the rows a recalc changed, read back in its transaction (new
-- version included): the one place the outbox envelope is written.
-- name: write_snapshot_events
WITH changed (entity, topic, event_type, id, version, snapshot) AS (
    SELECT 'project', 'pin.chessboard.project-upserted.v1', 'ProjectUpsertedKafkaEvent',
           p.id, p.version, to_jsonb(p)
    FROM chessboard.projects AS p
    WHERE p.id = ANY (CAST(:project_ids AS uuid[]))
    UNION ALL
    SELECT 'layout', 'pin.chessboard.layout-upserted.v1', 'LayoutUpsertedKafkaEvent',
           l.id, l.version, to_jsonb(l)
    FROM chessboard.layouts AS l
    WHERE l.id = ANY (CAST(:layout_ids AS uuid[]))
    UNION ALL
    SELECT 'layout_group', 'pin.chessboard.layout-group-upserted.v1',
           'LayoutGroupUpsertedKafkaEvent', g.id, g.version, to_jsonb(g)
    FROM chessboard.layout_groups AS g
    WHERE g.id = ANY (CAST(:layout_group_ids AS uuid[]))
)
INSERT INTO chessboard.event_outbox (topic, entity, entity_id, tenant_id, version, payload)
SELECT c.topic, c.entity, c.id, CAST(:tenant_id AS uuid), c.version,
       jsonb_build_object(
           'contract_version', 1, 'event_type', c.event_type,
           'id', c.id, 'tenant_id', CAST(:tenant_id AS uuid), 'version', c.version,
           'occurred_at', now(), 'snapshot', c.snapshot)
FROM changed AS c
ORDER BY CASE c.entity WHEN 'project' THEN 0 WHEN 'layout' THEN 1 ELSE 2 END, c.id

-- ---------------------------------------------------------------------------------------
-- Divergence check (runbook "расхождение денормализации"): stored values vs the truth.

-- Which of the given ids name a project at all (a runbook action on a mistyped id refuses).
-- name: existing_projects
SELECT id FROM chessboard.projects WHERE id = ANY(:project_ids)

-- name: divergence
WITH po AS (
    SELECT * FROM chessboard.property_objects
    WHERE project_id = :project_id AND deleted_at IS NULL
),
project_truth AS (
    SELECT 'project' AS entity, p.id,
           jsonb_build_object(
               'price_min', p.price_min, 'price_max', p.price_max,
               'property_objects_total_count', p.property_objects_total_count,
               'property_objects_free_count', p.property_objects_free_count) AS stored,
           jsonb_build_object(
               'price_min', (SELECT min(price) FROM po WHERE status = 'Free'),
               'price_max', (SELECT max(price) FROM po WHERE status = 'Free'),
               'property_objects_total_count', (SELECT count(*) FROM po WHERE status <> 'Hidden'),
               'property_objects_free_count', (SELECT count(*) FROM po WHERE status = 'Free')
           ) AS truth
    FROM chessboard.projects AS p
    WHERE p.id = :project_id
),
building_truth AS (
    SELECT 'building', b.id,
           jsonb_build_object(
               'property_objects_total_count', b.property_objects_total_count,
               'property_objects_free_count', b.property_objects_free_count),
           jsonb_build_object(
               'property_objects_total_count',
               (SELECT count(*) FROM po WHERE po.building_id = b.id AND status <> 'Hidden'),
               'property_objects_free_count',
               (SELECT count(*) FROM po WHERE po.building_id = b.id AND status = 'Free'))
    FROM chessboard.buildings AS b
    WHERE b.project_id = :project_id
),
layout_truth AS (
    SELECT 'layout', l.id,
           jsonb_build_object('property_objects_count', l.property_objects_count),
           jsonb_build_object(
               'property_objects_count',
               (SELECT count(*) FROM po WHERE po.layout_id = l.id AND status <> 'Hidden'))
    FROM chessboard.layouts AS l
    WHERE l.project_id = :project_id
),
group_truth AS (
    SELECT 'layout_group', g.id,
           jsonb_build_object(
               'layouts_count', g.layouts_count, 'area_min', g.area_min,
               'area_max', g.area_max),
           (SELECT jsonb_build_object(
                       'layouts_count', count(*), 'area_min', min(l.total_area),
                       'area_max', max(l.total_area))
            FROM chessboard.layouts AS l
            WHERE l.project_id = :project_id AND l.layout_group_id = g.id
              AND l.deleted_at IS NULL)
    FROM chessboard.layout_groups AS g
    WHERE g.project_id = :project_id
)
SELECT entity, id, stored, truth
FROM (
    SELECT * FROM project_truth
    UNION ALL SELECT * FROM building_truth
    UNION ALL SELECT * FROM layout_truth
    UNION ALL SELECT * FROM group_truth
) AS rows
WHERE stored <> truth
ORDER BY entity, id

-- ---------------------------------------------------------------------------------------
-- Metrics (AGG-8): counters persisted because drain runs are short-lived processes.

-- name: add_metric
INSERT INTO chessboard.recalc_metrics AS m (name, label, value, updated_at)
SELECT u.name, u.label, u.value, now()
FROM unnest(CAST(:names AS text[]), CAST(:labels AS text[]), CAST(:values AS float8[]))
     AS u(name, label, value)
ON CONFLICT (name, label) DO UPDATE
SET value = m.value + excluded.value, updated_at = excluded.updated_at

-- read_at: the database's clock, which updated_at is on (the liveness check's one clock).
-- name: read_metrics
SELECT name, label, value, updated_at, now() AS read_at
FROM chessboard.recalc_metrics ORDER BY name, label

-- name: outbox_stats
SELECT count(*) AS pending,
       extract(epoch FROM now() - min(created_at)) AS oldest_pending_age_seconds
FROM chessboard.event_outbox
WHERE published_at IS NULL

-- ---------------------------------------------------------------------------------------
-- Outbox publisher (AGG-5: at-least-once delivery after commit)

-- name: unpublished_events
SELECT id, topic, entity, entity_id, tenant_id, version, payload
FROM chessboard.event_outbox
WHERE published_at IS NULL
ORDER BY id
LIMIT :limit

-- Only after the broker acknowledged the message.
-- name: mark_published
UPDATE chessboard.event_outbox
SET published_at = now()
WHERE id = ANY (CAST(:ids AS bigint[])) AND published_at IS NULL

-- name: mark_failed
UPDATE chessboard.event_outbox AS o
SET publish_attempts = o.publish_attempts + 1, last_error = f.error
FROM unnest(CAST(:ids AS bigint[]), CAST(:errors AS text[])) AS f(id, error)
WHERE o.id = f.id
