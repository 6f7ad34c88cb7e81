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
