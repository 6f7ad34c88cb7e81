-- Migration 0004n: news hardening (issue 8): a cut DailyWindow pass's window, retired totals.

ALTER TABLE pin.job_checkpoints
    ADD COLUMN window_start timestamptz,
    ADD COLUMN window_end timestamptz;

CREATE TABLE pin.retired_totals (
    counter text NOT NULL,
    label text NOT NULL DEFAULT '',
    value double precision NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (counter, label)
);

CREATE INDEX ix_sdo_done_updated ON news.snapshot_detach_outbox (updated_at)
    WHERE status = 'Done';

CREATE INDEX ix_event_outbox_published ON chessboard.event_outbox (published_at)
    WHERE published_at IS NOT NULL;

CREATE INDEX ix_job_runs_finished ON pin.job_runs (finished_at);
