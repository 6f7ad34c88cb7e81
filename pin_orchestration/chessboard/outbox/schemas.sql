-- The columns of an entity table, in order: the fields of the snapshot its upserted event
-- carries (the recalc writes the event's snapshot as to_jsonb(row)).

-- name: entity_columns
SELECT column_name, data_type, is_nullable = 'YES' AS nullable, character_maximum_length
FROM information_schema.columns
WHERE table_schema = 'chessboard' AND table_name = :table_name
ORDER BY ordinal_position
