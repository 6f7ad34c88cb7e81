-- Privileges of a raiser: a role another service connects as to raise a chessboard recalc
-- or a snapshot detach through the SQL functions of migration 0005, or to submit a
-- scraping job through scraping.submit_job (migration 0011), and nothing else.

-- name: role_exists
SELECT EXISTS (SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = CAST(:role AS text))

-- GRANT takes no bind parameters: the role name is quoted by format('%I') on the server.
-- USAGE on a schema only lets the role name the functions; it gives no table access.
-- name: grant_raiser_statements
SELECT format('GRANT USAGE ON SCHEMA chessboard, news, scraping TO %I', CAST(:role AS text))
UNION ALL
SELECT format(
    'GRANT EXECUTE ON FUNCTION chessboard.request_project_recalc(uuid, uuid, text), '
    'news.enqueue_snapshot_detach(uuid, uuid, text), '
    'scraping.submit_job(uuid, text, jsonb, text, text, text) TO %I',
    CAST(:role AS text)
)
