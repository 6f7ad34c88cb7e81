-- Migration 0005 down: back to 0004c.

DROP FUNCTION news.enqueue_snapshot_detach(uuid, uuid, text);
DROP FUNCTION chessboard.request_project_recalc(uuid, uuid, text);

DROP FUNCTION chessboard.request_project_recalc_at(uuid, uuid, text, timestamptz,
    double precision, double precision);

DROP FUNCTION pin.uuid7();
