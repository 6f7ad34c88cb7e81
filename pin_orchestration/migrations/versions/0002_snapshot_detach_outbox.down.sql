-- Migration 0002 down: back to 0001.

DROP TABLE news.snapshot_detach_outbox;
