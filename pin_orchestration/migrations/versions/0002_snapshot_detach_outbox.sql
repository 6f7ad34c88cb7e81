-- Migration 0002: news.snapshot_detach_outbox (issue 3, seed 001).

CREATE TABLE news.snapshot_detach_outbox (
    id uuid PRIMARY KEY,
    snapshot_id uuid NOT NULL,
    post_id uuid NOT NULL,
    reason varchar(16) NOT NULL
        CHECK (reason IN ('BlockReplaced', 'PostDeleted')),
    attempts integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    status varchar(16) NOT NULL DEFAULT 'Pending'
        CHECK (status IN ('Pending', 'Done', 'Quarantined')),
    last_error varchar(512),
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- One active intent per snapshot (the detach is one-shot): dedupe key of the enqueue.
CREATE UNIQUE INDEX ux_sdo_snapshot ON news.snapshot_detach_outbox (snapshot_id)
    WHERE status <> 'Done';

-- The claim and the sensor read due rows: status = 'Pending' AND next_attempt_at <= now.
CREATE INDEX ix_sdo_due ON news.snapshot_detach_outbox (status, next_attempt_at);

CREATE INDEX ix_sdo_post ON news.snapshot_detach_outbox (post_id);
