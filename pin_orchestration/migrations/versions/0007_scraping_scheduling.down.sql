-- Migration 0007 down: back to 0006.

DROP FUNCTION scraping.claim_jobs(text, integer, double precision, double precision, integer);
DROP TABLE scraping.tenant_vtimes;
DROP TABLE scraping.pick_classes;
DROP TABLE scraping.domains;
ALTER TABLE scraping.tenants DROP COLUMN weight;
ALTER TABLE scraping.jobs DROP COLUMN domain;
