"""scraping scheduling (issue 9, SPEC SCR-7…SCR-9): per-domain limits, tenant fairness,
6:3:1 priorities, all in the one claim function `scraping.claim_jobs`.

- `scraping.jobs.domain`: the URL's host, lowercased, IDNA-encoded, set at intake.
- `scraping.domains`: per-domain overrides (`pin scraping domain set`) and the shared
  politeness state every worker reads and writes: the token bucket (`tokens` at
  `tokens_at`) and `blocked_until` (a 429 or Retry-After from the domain).
- `scraping.tenants.weight` (`pin tenant set-weight`), `scraping.pick_classes` and
  `scraping.tenant_vtimes`: the virtual clocks of the fair pick.

Revision ID: 0007
Revises: 0006
"""

from urllib.parse import urlsplit

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

# The claim. Serialised by one transaction-level advisory lock (see the plan below).
CLAIM_LOCK_KEY = 7_274_720_907

DOMAIN_ROOM = """
CREATE FUNCTION scraping.domain_room(
    p_domain text,
    p_at timestamptz,
    p_used integer,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
-- Can `p_domain` take one more request at `p_at`, `p_used` tokens having been spent on it
-- by the calling claim already? Not while a 429/Retry-After pause holds, not with its
-- concurrency reached (running jobs, counted from the jobs themselves so nothing can
-- drift), not with less than one token in its bucket. The bucket holds max(1, rps) tokens
-- (one second's burst) and refills at rps; a domain without a row has a full bucket.
DECLARE
    d scraping.domains;
    v_rps double precision;
    v_capacity double precision;
    v_tokens double precision;
    v_running integer;
BEGIN
    SELECT * INTO d FROM scraping.domains WHERE domain = p_domain;
    IF d.blocked_until > p_at THEN
        RETURN false;
    END IF;
    v_rps := coalesce(d.rps, p_default_rps);
    v_capacity := greatest(1.0, v_rps);
    v_tokens := CASE
        WHEN d.tokens IS NULL THEN v_capacity
        ELSE least(v_capacity,
                   d.tokens + v_rps * greatest(0.0, extract(epoch FROM p_at - d.tokens_at)))
    END;
    IF v_tokens - p_used < 1 THEN
        RETURN false;
    END IF;
    SELECT count(*) INTO v_running
    FROM scraping.jobs WHERE status = 'running' AND domain = p_domain;
    RETURN v_running < coalesce(d.concurrency, p_default_concurrency);
END
$fn$
"""

CLAIM_JOBS = f"""
CREATE FUNCTION scraping.claim_jobs(
    p_worker text,
    p_limit integer,
    p_lease_seconds double precision,
    p_default_rps double precision,
    p_default_concurrency integer
) RETURNS SETOF scraping.jobs
LANGUAGE plpgsql VOLATILE AS $fn$
-- Claim up to p_limit due jobs for worker p_worker: each gets a lease, its attempt counter
-- and an attempt row. Every pick goes priority -> tenant -> domain with room -> oldest due:
--
-- 1. Priority class: start-time fair queuing over the classes with weights 6:3:1. A class's
--    start tag is max(its finish tag, the class clock); the smallest start tag wins (ties:
--    the higher class), then its finish tag grows by 60/share (10, 20, 60). With all three
--    backlogged every window of ten picks is exactly 6 high, 3 normal, 1 low; a class with
--    nothing claimable is passed over (its share goes to the others in proportion) and,
--    when it comes back, starts at the clock: it cannot hoard credit, and low always moves.
-- 2. Tenant, inside the class: the same scheme over tenants, step 1/weight per job started
--    (pick_classes.tenant_clock is the class's tenant clock). A tenant idle for a while
--    comes back at the clock, i.e. first in line: served at the next pick of its class.
-- 3. Job of that tenant: its oldest due jobs in (next_attempt_at, id) order, skipping those
--    whose domain has no room (scraping.domain_room); at most 256 looked at. When all 256
--    sit on domains without room (a crawler's backlog on one busy site), the tenant's
--    distinct domains are walked instead (a skip scan) and the first domain with room
--    gives its oldest due job. A tenant with nothing claimable is passed over for this call.
--
-- Plan (EXPLAIN of the statements below at 1M queued jobs: bench/scraping_pick.py):
-- - active tenants of a class: a recursive skip scan over ix_jobs_pick (priority,
--   tenant_id, ...) WHERE status = 'queued', one index probe per tenant, once per call;
-- - the head of a tenant: an index range scan of ix_jobs_pick in due order, LIMIT 256,
--   the domain read from the index (INCLUDE);
-- - the deep walk: a skip scan over ix_jobs_pick_domain (priority, tenant_id, domain, ...);
-- - domain room: a primary-key probe of scraping.domains and a count over
--   ix_jobs_running_domain (domain) WHERE status = 'running' (only running jobs: small);
-- - the chosen job is locked with FOR UPDATE SKIP LOCKED (cancels and intake never wait on a
--   claim, and a row locked elsewhere is skipped) and updated by primary key.
-- So a pick costs a few index probes whatever the queue's depth; nothing scans the queue.
--
-- Concurrent workers: the whole claim holds one transaction-level advisory lock, so two
-- claims never both see a domain's last free connection or token, and the virtual clocks
-- advance one pick at a time. A claim takes milliseconds and each worker claims a batch
-- per round, so the lock is held a small fraction of the time. Token spending is written
-- once at the end, domains in name order (as finish_attempts writes its pauses), so a
-- claim and an outcome write can never deadlock on domain rows.
DECLARE
    t0 timestamptz;
    n integer := 0;
    full_domains text[] := '{{}}';
    used_domains text[] := '{{}}';
    used_counts integer[] := '{{}}';
    done_classes text[] := '{{}}';
    passed text[] := '{{}}';   -- 'class/tenant' with nothing claimable in this call
    deep text[] := '{{}}';     -- 'class/tenant' whose due head sits on full domains
    act_high uuid[];
    act_normal uuid[];
    act_low uuid[];
    act uuid[];
    v_class text;
    v_class_start bigint;
    v_class_step bigint;
    v_tenant uuid;
    v_tenant_start double precision;
    v_weight double precision;
    v_key text;
    v_job uuid;
    v_domain text;
    v_dom text;
    v_pos integer;
    v_seen integer;
    r record;
    claimed scraping.jobs;
BEGIN
    IF p_limit IS NULL OR p_limit <= 0 THEN
        RETURN;
    END IF;
    PERFORM pg_advisory_xact_lock({CLAIM_LOCK_KEY});
    -- One clock for the whole claim, read after the lock: token refills are measured
    -- between claims that really ran one after the other.
    t0 := clock_timestamp();

    <<picks>>
    WHILE n < p_limit LOOP
        SELECT c.priority,
               greatest(c.vtime, (SELECT max(last_start) FROM scraping.pick_classes)),
               60 / c.share
        INTO v_class, v_class_start, v_class_step
        FROM scraping.pick_classes c
        WHERE c.priority <> ALL (done_classes)
        ORDER BY 2, c.share DESC
        LIMIT 1;
        EXIT picks WHEN NOT FOUND;

        act := CASE v_class WHEN 'high' THEN act_high WHEN 'normal' THEN act_normal
                            ELSE act_low END;
        IF act IS NULL THEN
            WITH RECURSIVE t(tid) AS (
                (SELECT j.tenant_id FROM scraping.jobs j
                 WHERE j.status = 'queued' AND j.priority = v_class
                 ORDER BY j.tenant_id LIMIT 1)
                UNION ALL
                SELECT (SELECT j.tenant_id FROM scraping.jobs j
                        WHERE j.status = 'queued' AND j.priority = v_class
                          AND j.tenant_id > t.tid
                        ORDER BY j.tenant_id LIMIT 1)
                FROM t WHERE t.tid IS NOT NULL
            )
            SELECT coalesce(array_agg(tid), '{{}}') INTO act FROM t WHERE tid IS NOT NULL;
            CASE v_class
                WHEN 'high' THEN act_high := act;
                WHEN 'normal' THEN act_normal := act;
                ELSE act_low := act;
            END CASE;
        END IF;

        v_job := NULL;
        <<tenants>>
        LOOP
            SELECT a.tid,
                   greatest(coalesce(v.vtime, 0), c.tenant_clock),
                   tn.weight
            INTO v_tenant, v_tenant_start, v_weight
            FROM unnest(act) AS a(tid)
            JOIN scraping.tenants tn ON tn.id = a.tid
            JOIN scraping.pick_classes c ON c.priority = v_class
            LEFT JOIN scraping.tenant_vtimes v
                   ON v.priority = v_class AND v.tenant_id = a.tid
            WHERE (v_class || '/' || a.tid) <> ALL (passed)
            ORDER BY 2, a.tid
            LIMIT 1;
            IF NOT FOUND THEN
                done_classes := done_classes || v_class;
                CONTINUE picks;
            END IF;
            v_key := v_class || '/' || v_tenant;

            IF NOT v_key = ANY (deep) THEN
                v_seen := 0;
                FOR r IN
                    SELECT j.id, j.domain FROM scraping.jobs j
                    WHERE j.status = 'queued' AND j.priority = v_class
                      AND j.tenant_id = v_tenant AND j.next_attempt_at <= t0
                    ORDER BY j.next_attempt_at, j.id
                    LIMIT 256
                LOOP
                    v_seen := v_seen + 1;
                    CONTINUE WHEN r.domain = ANY (full_domains);
                    v_pos := array_position(used_domains, r.domain);
                    IF NOT scraping.domain_room(
                            r.domain, t0, coalesce(used_counts[v_pos], 0),
                            p_default_rps, p_default_concurrency) THEN
                        full_domains := full_domains || r.domain;
                        CONTINUE;
                    END IF;
                    SELECT j.id INTO v_job FROM scraping.jobs j
                    WHERE j.id = r.id AND j.status = 'queued'
                    FOR UPDATE SKIP LOCKED;
                    IF FOUND THEN
                        v_domain := r.domain;
                        EXIT;
                    END IF;
                END LOOP;
                IF v_job IS NULL AND v_seen = 256 THEN
                    deep := deep || v_key;
                END IF;
            END IF;

            IF v_job IS NULL AND v_key = ANY (deep) THEN
                v_dom := '';
                LOOP
                    SELECT j.domain INTO v_dom FROM scraping.jobs j
                    WHERE j.status = 'queued' AND j.priority = v_class
                      AND j.tenant_id = v_tenant AND j.domain > v_dom
                    ORDER BY j.domain
                    LIMIT 1;
                    EXIT WHEN NOT FOUND;
                    CONTINUE WHEN v_dom = ANY (full_domains);
                    v_pos := array_position(used_domains, v_dom);
                    IF NOT scraping.domain_room(
                            v_dom, t0, coalesce(used_counts[v_pos], 0),
                            p_default_rps, p_default_concurrency) THEN
                        full_domains := full_domains || v_dom;
                        CONTINUE;
                    END IF;
                    SELECT j.id INTO v_job FROM scraping.jobs j
                    WHERE j.status = 'queued' AND j.priority = v_class
                      AND j.tenant_id = v_tenant AND j.domain = v_dom
                      AND j.next_attempt_at <= t0
                    ORDER BY j.next_attempt_at, j.id
                    LIMIT 1
                    FOR UPDATE SKIP LOCKED;
                    IF FOUND THEN
                        v_domain := v_dom;
                        EXIT;
                    END IF;
                END LOOP;
            END IF;

            EXIT tenants WHEN v_job IS NOT NULL;
            passed := passed || v_key;
        END LOOP;

        UPDATE scraping.jobs j
        SET status = 'running',
            attempts = j.attempts + 1,
            lease_owner = p_worker,
            lease_expires_at = now() + make_interval(secs => p_lease_seconds),
            started_at = coalesce(j.started_at, now()),
            updated_at = now()
        WHERE j.id = v_job
        RETURNING j.* INTO claimed;
        INSERT INTO scraping.job_attempts (job_id, number, worker)
        VALUES (claimed.id, claimed.attempts, p_worker);

        v_pos := array_position(used_domains, v_domain);
        IF v_pos IS NULL THEN
            used_domains := used_domains || v_domain;
            used_counts := used_counts || 1;
        ELSE
            used_counts[v_pos] := used_counts[v_pos] + 1;
        END IF;

        UPDATE scraping.pick_classes
        SET vtime = v_class_start + v_class_step,
            last_start = v_class_start,
            tenant_clock = v_tenant_start
        WHERE priority = v_class;
        INSERT INTO scraping.tenant_vtimes AS tv (priority, tenant_id, vtime)
        VALUES (v_class, v_tenant, v_tenant_start + 1.0 / v_weight)
        ON CONFLICT (priority, tenant_id) DO UPDATE SET vtime = EXCLUDED.vtime;

        n := n + 1;
        RETURN NEXT claimed;
    END LOOP;

    -- Spend the tokens: refill to t0, minus what this claim took. A new row starts from a
    -- full default bucket; for an existing one, EXCLUDED.tokens is that same full default
    -- bucket minus what was used, so the difference is what this claim took.
    INSERT INTO scraping.domains AS d (domain, tokens, tokens_at)
    SELECT u.domain, greatest(1.0, p_default_rps) - u.used, t0
    FROM unnest(used_domains, used_counts) AS u(domain, used)
    ORDER BY u.domain
    ON CONFLICT (domain) DO UPDATE
    SET tokens = CASE
            WHEN d.tokens IS NULL THEN greatest(1.0, coalesce(d.rps, p_default_rps))
            ELSE least(greatest(1.0, coalesce(d.rps, p_default_rps)),
                       d.tokens + coalesce(d.rps, p_default_rps)
                                  * greatest(0.0, extract(epoch FROM t0 - d.tokens_at)))
        END - (greatest(1.0, p_default_rps) - EXCLUDED.tokens),
        tokens_at = t0;
    RETURN;
END
$fn$
"""


def upgrade() -> None:
    op.execute("ALTER TABLE scraping.jobs ADD COLUMN domain text")
    _backfill_domains()
    op.execute("ALTER TABLE scraping.jobs ALTER COLUMN domain SET NOT NULL")
    # The pick: a tenant's due head in one class (the domain read from the index) ...
    op.execute(
        "CREATE INDEX ix_jobs_pick ON scraping.jobs (priority, tenant_id, next_attempt_at, id) "
        "INCLUDE (domain) WHERE status = 'queued'"
    )
    # ... a tenant's distinct domains in one class, each domain's oldest due ...
    op.execute(
        "CREATE INDEX ix_jobs_pick_domain ON scraping.jobs "
        "(priority, tenant_id, domain, next_attempt_at, id) WHERE status = 'queued'"
    )
    # ... and the connections a domain has open. The sensor walks queued domains.
    op.execute(
        "CREATE INDEX ix_jobs_running_domain ON scraping.jobs (domain) WHERE status = 'running'"
    )
    op.execute(
        "CREATE INDEX ix_jobs_queued_domain ON scraping.jobs (domain, next_attempt_at) "
        "WHERE status = 'queued'"
    )
    op.execute(
        "ALTER TABLE scraping.tenants ADD COLUMN weight double precision NOT NULL DEFAULT 1 "
        "CONSTRAINT tenants_weight_check CHECK (weight > 0 AND weight <= 1000)"
    )
    op.execute(
        """
        CREATE TABLE scraping.domains (
            domain text PRIMARY KEY,
            -- Overrides of PIN_SCRAPING_DOMAIN_RPS / _CONCURRENCY; NULL = the default.
            rps double precision CONSTRAINT domains_rps_check CHECK (rps > 0 AND rps <= 10000),
            concurrency integer CONSTRAINT domains_concurrency_check
                CHECK (concurrency > 0 AND concurrency <= 10000),
            -- Token bucket: `tokens` as of `tokens_at` (NULL: full).
            tokens double precision,
            tokens_at timestamptz,
            -- No request to this domain before then (its 429 / Retry-After).
            blocked_until timestamptz,
            updated_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        """
        CREATE TABLE scraping.pick_classes (
            priority text PRIMARY KEY CHECK (priority IN ('high', 'normal', 'low')),
            share integer NOT NULL CHECK (share > 0 AND 60 % share = 0),
            -- Finish tag of the class's last pick, start tag of it (the class clock is the
            -- largest last_start), and the clock of the tenants inside the class.
            vtime bigint NOT NULL DEFAULT 0,
            last_start bigint NOT NULL DEFAULT 0,
            tenant_clock double precision NOT NULL DEFAULT 0
        )
        """
    )
    op.execute(
        "INSERT INTO scraping.pick_classes (priority, share) "
        "VALUES ('high', 6), ('normal', 3), ('low', 1)"
    )
    op.execute(
        """
        CREATE TABLE scraping.tenant_vtimes (
            priority text NOT NULL REFERENCES scraping.pick_classes (priority),
            tenant_id uuid NOT NULL REFERENCES scraping.tenants (id) ON DELETE CASCADE,
            vtime double precision NOT NULL,
            PRIMARY KEY (priority, tenant_id)
        )
        """
    )
    op.execute(DOMAIN_ROOM)
    op.execute(CLAIM_JOBS)


def _backfill_domains() -> None:
    """Jobs accepted before this revision get the host of their URL (lowercased, IDNA)."""
    import idna

    conn = op.get_bind()
    rows = conn.execute(sa.text("SELECT id, url FROM scraping.jobs")).all()
    for job_id, url in rows:
        host = (urlsplit(url).hostname or "").rstrip(".")
        try:
            domain = idna.encode(host, uts46=True).decode("ascii") if host else ""
        except idna.IDNAError:
            domain = host.lower()
        conn.execute(
            sa.text("UPDATE scraping.jobs SET domain = :domain WHERE id = :id"),
            {"domain": domain, "id": job_id},
        )


def downgrade() -> None:
    op.execute(
        "DROP FUNCTION scraping.claim_jobs(text, integer, double precision, "
        "double precision, integer)"
    )
    op.execute(
        "DROP FUNCTION scraping.domain_room(text, timestamptz, integer, double precision, integer)"
    )
    op.execute("DROP TABLE scraping.tenant_vtimes")
    op.execute("DROP TABLE scraping.pick_classes")
    op.execute("DROP TABLE scraping.domains")
    op.execute("ALTER TABLE scraping.tenants DROP COLUMN weight")
    op.execute("ALTER TABLE scraping.jobs DROP COLUMN domain")
