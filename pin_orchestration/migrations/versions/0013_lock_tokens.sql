-- Migration 0013: pin.distributed_locks.token: a fencing token per acquisition (issue 20).

ALTER TABLE pin.distributed_locks
    ADD COLUMN token uuid NOT NULL UNIQUE DEFAULT gen_random_uuid();
