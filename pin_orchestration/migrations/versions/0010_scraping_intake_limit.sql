-- Migration 0010: scraping: the per-tenant intake rate limit of POST /jobs (issue 11).

CREATE TABLE scraping.intake_buckets (
    tenant_id uuid PRIMARY KEY REFERENCES scraping.tenants (id) ON DELETE CASCADE,
    tokens double precision NOT NULL,
    refilled_at timestamptz NOT NULL
) WITH (fillfactor = 50);
