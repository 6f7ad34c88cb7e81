-- Migration 0013 down: back to 0012.

ALTER TABLE pin.distributed_locks DROP COLUMN token;
