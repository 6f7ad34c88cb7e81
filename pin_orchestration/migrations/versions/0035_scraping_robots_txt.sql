-- 0035: robots.txt shared by the fleet; Crawl-delay caps a host's rate; operators' exemptions.
-- A job's own fetch timeout (POST /jobs timeout_seconds); NULL: the service's.
ALTER TABLE scraping.jobs
    ADD COLUMN timeout_seconds double precision
        CONSTRAINT jobs_timeout_seconds_check CHECK (timeout_seconds > 0);

CREATE TABLE scraping.robots (
    -- scheme://host:port, what a robots.txt governs (RFC 9309 section 2.3)
    origin text PRIMARY KEY,
    -- the host, as scraping.domains keys it
    domain text NOT NULL,
    -- rules: the body below governs; allow_all: unavailable (4xx), everything allowed;
    -- unreachable: 5xx or no answer, everything disallowed until a fetch succeeds;
    -- NULL: never fetched yet
    state text CHECK (state IN ('rules', 'allow_all', 'unreachable')),
    http_status integer,
    body text,
    crawl_delay double precision,
    fetched_at timestamptz,
    -- fetched again after this (for an unreachable one: its next try)
    expires_at timestamptz,
    -- fetches in a row that found it unreachable (the backoff's exponent)
    failures integer NOT NULL DEFAULT 0,
    last_error text,
    -- the worker fetching it now, for the job it judges; the others wait for it while
    -- that job runs under that worker with a live lease (a killed worker's lease is
    -- taken over once its job is swept or its lease runs out)
    lease_owner text,
    lease_job uuid,
    lease_expires_at timestamptz,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX ix_robots_domain ON scraping.robots (domain);

ALTER TABLE scraping.domains
    ADD COLUMN configured_rps double precision
        CONSTRAINT domains_configured_rps_check
        CHECK (configured_rps >= 0.01 AND configured_rps <= 10000),
    ADD COLUMN crawl_delay double precision
        CONSTRAINT domains_crawl_delay_check CHECK (crawl_delay >= 0),
    ADD COLUMN robots_default_rps double precision,
    ADD COLUMN robots_mode text
        CONSTRAINT domains_robots_mode_check CHECK (robots_mode IN ('obey', 'ignore')),
    ADD COLUMN robots_reason text,
    ADD COLUMN robots_set_by text,
    ADD COLUMN robots_set_at timestamptz;
UPDATE scraping.domains SET configured_rps = rps WHERE rps IS NOT NULL;

-- Who paused a host (GET /jobs/{id}'s wait says): 'operator' (`pin scraping domain pause`
-- sets pin.scraping_pause_cause in its transaction) or 'retry_after' (a 429 / Retry-After,
-- the worker's). A robots.txt that is unreachable is told from scraping.robots.
ALTER TABLE scraping.domains
    ADD COLUMN pause_cause text
        CONSTRAINT domains_pause_cause_check CHECK (pause_cause IN ('operator', 'retry_after'));

-- The robots.txt state every worker shares (migration 0035; scraping/robots.py).
--
-- A host's effective rate, what the claim and redirect hops enforce (scraping.domains.rps),
-- is derived from the operator's limit (configured_rps, `pin scraping domain set --rps`) and
-- the host's robots.txt Crawl-delay: min(configured or the default, 1 / Crawl-delay), never
-- below the claim's floor of 0.01 requests per second (a bucket refills within 100 s). The
-- delay is stretched by a tenth: a turn is taken in the database and its request reaches
-- the host a few milliseconds later, unevenly, so turns spaced by exactly the delay
-- arrive sometimes closer than it; the host sees at least its delay.
-- robots_default_rps is PIN_SCRAPING_DOMAIN_RPS as the worker that read the Crawl-delay
-- had it. Written here so the claim reads one column, as before robots.txt existed.
CREATE OR REPLACE FUNCTION scraping.domains_effective_rps() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF TG_OP = 'INSERT' AND NEW.configured_rps IS NULL AND NEW.crawl_delay IS NULL THEN
        -- a row inserted with its rate (older callers, tests): that rate is the operator's
        NEW.configured_rps := NEW.rps;
        RETURN NEW;
    END IF;
    NEW.rps := CASE
        WHEN NEW.crawl_delay > 0 THEN
            least(coalesce(NEW.configured_rps, NEW.robots_default_rps),
                  greatest(1.0 / (NEW.crawl_delay * 1.1), 0.01))
        ELSE NEW.configured_rps
    END;
    RETURN NEW;
END
$fn$;

-- A pause that lengthens records who set it: an operator's transaction says so in
-- pin.scraping_pause_cause; any other is a target's 429 / Retry-After (the worker's).
CREATE OR REPLACE FUNCTION scraping.domains_pause_cause() RETURNS trigger
LANGUAGE plpgsql AS $fn$
BEGIN
    IF NEW.blocked_until IS NOT NULL
       AND (TG_OP = 'INSERT' OR NEW.blocked_until IS DISTINCT FROM OLD.blocked_until) THEN
        NEW.pause_cause := coalesce(
            nullif(current_setting('pin.scraping_pause_cause', true), ''), 'retry_after');
    END IF;
    RETURN NEW;
END
$fn$;

CREATE TRIGGER domains_pause_cause
BEFORE INSERT OR UPDATE OF blocked_until ON scraping.domains
FOR EACH ROW EXECUTE FUNCTION scraping.domains_pause_cause();

CREATE TRIGGER domains_effective_rps
BEFORE INSERT OR UPDATE OF configured_rps, crawl_delay, robots_default_rps ON scraping.domains
FOR EACH ROW EXECUTE FUNCTION scraping.domains_effective_rps();
