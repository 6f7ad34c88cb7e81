-- Migration 0010 down: back to 0009.

DROP TABLE scraping.intake_buckets;
