-- Migration 0004n down: back to 0003.

DROP INDEX pin.ix_job_runs_finished;
DROP INDEX chessboard.ix_event_outbox_published;
DROP INDEX news.ix_sdo_done_updated;
DROP TABLE pin.retired_totals;
ALTER TABLE pin.job_checkpoints DROP COLUMN window_start, DROP COLUMN window_end;
