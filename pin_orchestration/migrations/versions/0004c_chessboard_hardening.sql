-- Migration 0004c: chessboard hardening (issue 8): the drain's claim lease, a failed row's delay.

ALTER TABLE chessboard.project_recalc_requests
    ADD COLUMN not_before timestamptz,
    ADD COLUMN claimed_until timestamptz,
    ADD COLUMN claim_token uuid,
    ADD COLUMN claimable_at timestamptz
        GENERATED ALWAYS AS (greatest(due_at, not_before, claimed_until)) STORED;

DROP INDEX chessboard.ix_project_recalc_due;

CREATE INDEX ix_project_recalc_claimable
    ON chessboard.project_recalc_requests (claimable_at);
