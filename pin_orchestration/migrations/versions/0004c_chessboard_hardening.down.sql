-- Migration 0004c down: back to 0004n.

DROP INDEX chessboard.ix_project_recalc_claimable;
CREATE INDEX ix_project_recalc_due ON chessboard.project_recalc_requests (due_at);

ALTER TABLE chessboard.project_recalc_requests
    DROP COLUMN claimable_at,
    DROP COLUMN claim_token,
    DROP COLUMN claimed_until,
    DROP COLUMN not_before;
