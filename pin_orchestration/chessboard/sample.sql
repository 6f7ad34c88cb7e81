-- Set-based generator of a chessboard world (demo data and the bench). Ids derive from
-- md5(prefix:kind:numbers), so a second run finds the same ids and ON CONFLICT DO NOTHING
-- makes it idempotent. Counters are left at their defaults: the recalc fills them.

-- name: projects
INSERT INTO chessboard.projects (id, tenant_id, name, status)
SELECT md5(:prefix || ':p:' || p)::uuid, md5(:prefix || ':t:' || (p % 10))::uuid,
       'Project ' || p, 'Published'
FROM generate_series(1, :projects) AS p
ON CONFLICT (id) DO NOTHING
RETURNING id, tenant_id

-- name: buildings
INSERT INTO chessboard.buildings (id, project_id, name)
SELECT md5(:prefix || ':b:' || p || ':' || b)::uuid, md5(:prefix || ':p:' || p)::uuid,
       'Building ' || b
FROM generate_series(1, :projects) AS p, generate_series(1, :buildings) AS b
ON CONFLICT (id) DO NOTHING

-- name: layout_groups
INSERT INTO chessboard.layout_groups (id, project_id, name)
SELECT md5(:prefix || ':g:' || p || ':' || g)::uuid, md5(:prefix || ':p:' || p)::uuid,
       g || '-room'
FROM generate_series(1, :projects) AS p, generate_series(1, :groups) AS g
ON CONFLICT (id) DO NOTHING

-- name: layouts
INSERT INTO chessboard.layouts (id, project_id, layout_group_id, name, total_area)
SELECT md5(:prefix || ':l:' || p || ':' || g || ':' || l)::uuid,
       md5(:prefix || ':p:' || p)::uuid, md5(:prefix || ':g:' || p || ':' || g)::uuid,
       'Layout ' || g || '.' || l, 20 + 18 * g + 1.5 * l
FROM generate_series(1, :projects) AS p, generate_series(1, :groups) AS g,
     generate_series(1, :layouts_per_group) AS l
ON CONFLICT (id) DO NOTHING

-- Statuses cycle Free ×5, Booked, Sold ×2, Hidden, Free; one object in 50 is soft-deleted.
-- name: property_objects
INSERT INTO chessboard.property_objects (
    id, project_id, building_id, layout_id, status, price, deleted_at, number
)
SELECT md5(:prefix || ':o:' || p || ':' || o)::uuid, md5(:prefix || ':p:' || p)::uuid,
       md5(:prefix || ':b:' || p || ':' || (o % :buildings + 1))::uuid,
       md5(:prefix || ':l:' || p || ':' || (o % :groups + 1) || ':'
           || (o / :groups % :layouts_per_group + 1))::uuid,
       (ARRAY['Free', 'Free', 'Free', 'Free', 'Free', 'Booked', 'Sold', 'Sold', 'Hidden',
              'Free'])[o % 10 + 1],
       4000000 + (o * 7919 + p * 104729) % 9000000,
       CASE WHEN o % 50 = 0 THEN now() END,
       'No. ' || o
FROM generate_series(1, :projects) AS p, generate_series(1, :objects) AS o
ON CONFLICT (id) DO NOTHING
