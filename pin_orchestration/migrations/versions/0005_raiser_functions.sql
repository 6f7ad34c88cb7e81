-- Migration 0005: SQL functions as the raising contract (issue 12).
-- Function bodies are kept byte for byte as this revision first ran them, indentation
-- included: PostgreSQL stores a body as written, and schema.sql compares them.

-- UUIDv7 like pin_orchestration.ids.uuid7: 48-bit Unix ms, version 7, RFC variant
-- (from gen_random_uuid), so outbox ids stay time-ordered whoever enqueues.
        CREATE FUNCTION pin.uuid7() RETURNS uuid
        LANGUAGE sql VOLATILE PARALLEL SAFE
        SET search_path = pg_catalog, pg_temp
        AS $$
            SELECT encode(
                set_bit(set_bit(
                    overlay(uuid_send(gen_random_uuid())
                            PLACING substring(int8send(
                                floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint)
                                FROM 3)
                            FROM 1 FOR 6),
                    52, 1), 53, 1),
                'hex')::uuid
        $$;

-- allowed: RecalcTriggerReason's values (a test compares them).
        CREATE FUNCTION chessboard.request_project_recalc_at(
            project_id uuid, tenant_id uuid, reason text, requested_at timestamptz,
            debounce_seconds double precision, cap_seconds double precision
        ) RETURNS timestamptz
        LANGUAGE plpgsql VOLATILE
        SET search_path = pg_catalog, pg_temp
        AS $$
        DECLARE
            p_project_id ALIAS FOR $1;
            p_tenant_id ALIAS FOR $2;
            p_reason ALIAS FOR $3;
            p_requested_at ALIAS FOR $4;
            p_debounce ALIAS FOR $5;
            p_cap ALIAS FOR $6;
            allowed text[] := ARRAY['PropertyObjectStatusChanged', 'PropertyObjectPriceChanged', 'PropertyObjectUpserted', 'LayoutChanged', 'TalentSync', 'Crud', 'Manual']::text[];
            due timestamptz;
        BEGIN
            IF p_project_id IS NULL THEN
                RAISE EXCEPTION 'project_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the id of the project whose aggregates are stale';
            END IF;
            IF p_tenant_id IS NULL THEN
                RAISE EXCEPTION 'tenant_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the tenant id of the project';
            END IF;
            IF p_reason IS NULL OR NOT (p_reason = ANY (allowed)) THEN
                RAISE EXCEPTION 'reason must be one of % (got %)',
                        array_to_string(allowed, ', '), coalesce(quote_literal(p_reason), 'NULL')
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            IF p_requested_at IS NULL OR p_debounce IS NULL OR p_cap IS NULL
               OR p_debounce <= 0 OR p_cap < p_debounce THEN
                RAISE EXCEPTION 'requested_at, debounce_seconds and cap_seconds must be set, '
                                'with 0 < debounce_seconds <= cap_seconds (got %, %, %)',
                        p_requested_at, p_debounce, p_cap
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- Trailing debounce with a starvation cap (seed 002, AGG-1): a new row is due
            -- debounce after the request; a further request moves it to request + debounce,
            -- never past first_requested_at + cap.
            INSERT INTO chessboard.project_recalc_requests AS r (
                project_id, tenant_id, due_at, first_requested_at, requested_count,
                last_reason, attempt_count, created_at, updated_at
            )
            VALUES (
                p_project_id, p_tenant_id,
                p_requested_at + make_interval(secs => p_debounce), p_requested_at, 1,
                p_reason, 0, p_requested_at, p_requested_at
            )
            ON CONFLICT ON CONSTRAINT project_recalc_requests_pkey DO UPDATE
            SET due_at = least(
                    excluded.updated_at + make_interval(secs => p_debounce),
                    r.first_requested_at + make_interval(secs => p_cap)
                ),
                requested_count = r.requested_count + 1,
                last_reason = excluded.last_reason,
                tenant_id = excluded.tenant_id,
                updated_at = excluded.updated_at
            RETURNING r.due_at INTO due;
            RETURN due;
        END
        $$;

        CREATE FUNCTION chessboard.request_project_recalc(
            project_id uuid, tenant_id uuid, reason text
        ) RETURNS timestamptz
        LANGUAGE sql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $$
            -- The policy of RecalcPolicy's defaults: debounce 30 s, cap 5 min.
            SELECT chessboard.request_project_recalc_at($1, $2, $3, now(), 30, 300)
        $$;

-- allowed: the CHECK of news.snapshot_detach_outbox.reason (migration 0002).
        CREATE FUNCTION news.enqueue_snapshot_detach(
            snapshot_id uuid, post_id uuid, reason text
        ) RETURNS uuid
        LANGUAGE plpgsql VOLATILE SECURITY DEFINER
        SET search_path = pg_catalog, pg_temp
        AS $$
        #variable_conflict use_column
        DECLARE
            p_snapshot_id ALIAS FOR $1;
            p_post_id ALIAS FOR $2;
            p_reason ALIAS FOR $3;
            allowed text[] := ARRAY['BlockReplaced', 'PostDeleted']::text[];
            entry_id uuid;
        BEGIN
            IF p_snapshot_id IS NULL THEN
                RAISE EXCEPTION 'snapshot_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the id of the orphaned selection snapshot';
            END IF;
            IF p_post_id IS NULL THEN
                RAISE EXCEPTION 'post_id must not be NULL'
                    USING ERRCODE = 'null_value_not_allowed',
                          HINT = 'pass the id of the post the snapshot belonged to';
            END IF;
            IF p_reason IS NULL OR NOT (p_reason = ANY (allowed)) THEN
                RAISE EXCEPTION 'reason must be one of % (got %)',
                        array_to_string(allowed, ', '), coalesce(quote_literal(p_reason), 'NULL')
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            -- One active (not Done) row per snapshot (ux_sdo_snapshot). When the insert
            -- meets an active row, that row may turn Done (committed by the worker) before
            -- the lookup reads it: the lookup then finds nothing, and the insert is tried
            -- again, now without a conflict. Each statement sees rows committed before it
            -- started, so the loop ends unless that race repeats.
            LOOP
                INSERT INTO news.snapshot_detach_outbox AS o (
                    id, snapshot_id, post_id, reason, attempts, next_attempt_at, status,
                    created_at, updated_at
                )
                VALUES (pin.uuid7(), p_snapshot_id, p_post_id, p_reason, 0, now(), 'Pending',
                        now(), now())
                ON CONFLICT (snapshot_id) WHERE status <> 'Done' DO NOTHING
                RETURNING o.id INTO entry_id;
                IF entry_id IS NOT NULL THEN
                    RETURN entry_id;
                END IF;
                SELECT o.id INTO entry_id
                FROM news.snapshot_detach_outbox AS o
                WHERE o.snapshot_id = p_snapshot_id AND o.status <> 'Done';
                IF entry_id IS NOT NULL THEN
                    RETURN entry_id;
                END IF;
            END LOOP;
        END
        $$;

-- Raising is granted per role (`pin db grant-raiser`), never to everyone. The _at
-- variant runs with its caller's privileges (SECURITY INVOKER), so leaving it to
-- PUBLIC gives nothing: only a role that may write the queue table can use it.
REVOKE EXECUTE ON FUNCTION chessboard.request_project_recalc(uuid, uuid, text) FROM PUBLIC;

REVOKE EXECUTE ON FUNCTION news.enqueue_snapshot_detach(uuid, uuid, text) FROM PUBLIC;
