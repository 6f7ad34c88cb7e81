-- Migration 0006 down: back to 0005.

DROP SCHEMA scraping CASCADE;
