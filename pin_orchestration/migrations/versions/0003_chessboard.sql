-- Migration 0003: the chessboard schema (issue 4): reference tables, recalc queue, event outbox.

CREATE SCHEMA IF NOT EXISTS chessboard;

CREATE TABLE chessboard.projects (
    id uuid PRIMARY KEY,
    tenant_id uuid,
    name text,
    status varchar(16) NOT NULL DEFAULT 'Draft'
        CHECK (status IN ('Draft', 'Published', 'Hidden', 'Archived')),
    deleted_at timestamptz,
    price_min numeric(18, 2),
    price_max numeric(18, 2),
    property_objects_total_count integer NOT NULL DEFAULT 0,
    property_objects_free_count integer NOT NULL DEFAULT 0,
    version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chessboard.buildings (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL,
    name text,
    deleted_at timestamptz,
    property_objects_total_count integer NOT NULL DEFAULT 0,
    property_objects_free_count integer NOT NULL DEFAULT 0,
    version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chessboard.layout_groups (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL,
    name text,
    deleted_at timestamptz,
    layouts_count integer NOT NULL DEFAULT 0,
    area_min numeric(12, 2),
    area_max numeric(12, 2),
    version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chessboard.layouts (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL,
    layout_group_id uuid,
    name text,
    total_area numeric(12, 2),
    deleted_at timestamptz,
    property_objects_count integer NOT NULL DEFAULT 0,
    version bigint NOT NULL DEFAULT 1,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE chessboard.property_objects (
    id uuid PRIMARY KEY,
    project_id uuid NOT NULL,
    building_id uuid,
    layout_id uuid,
    status varchar(16) NOT NULL,
    price numeric(18, 2),
    deleted_at timestamptz,
    number text,
    created_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now()
);

-- The recalc aggregates one project's live objects three ways (project, building,
-- layout): a covering index on project_id lets each be an index-only scan of that
-- project's slice instead of heap visits of ~2,000 rows.
CREATE INDEX ix_property_objects_project_live ON chessboard.property_objects
    (project_id) INCLUDE (building_id, layout_id, status, price)
    WHERE deleted_at IS NULL;

CREATE INDEX ix_buildings_project ON chessboard.buildings (project_id);

CREATE INDEX ix_layouts_project ON chessboard.layouts (project_id)
    INCLUDE (layout_group_id, total_area, deleted_at);

CREATE INDEX ix_layout_groups_project ON chessboard.layout_groups (project_id);

-- Seed 002, "Входная модель ProjectRecalcRequest" — column for column.
CREATE TABLE chessboard.project_recalc_requests (
    project_id uuid PRIMARY KEY,
    tenant_id uuid NOT NULL,
    due_at timestamptz NOT NULL,
    first_requested_at timestamptz NOT NULL,
    requested_count integer NOT NULL DEFAULT 1 CHECK (requested_count >= 1),
    last_reason varchar(32) NOT NULL,
    attempt_count integer NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    last_error varchar(1024),
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE INDEX ix_project_recalc_due ON chessboard.project_recalc_requests (due_at);

CREATE TABLE chessboard.event_outbox (
    id bigserial PRIMARY KEY,
    topic text NOT NULL,
    entity varchar(32) NOT NULL,
    entity_id uuid NOT NULL,
    tenant_id uuid,
    version bigint NOT NULL,
    payload jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now(),
    published_at timestamptz,
    publish_attempts integer NOT NULL DEFAULT 0,
    last_error varchar(1024)
);

-- The publisher reads unpublished rows in id order; published rows are history.
CREATE INDEX ix_event_outbox_unpublished ON chessboard.event_outbox (id)
    WHERE published_at IS NULL;

CREATE TABLE chessboard.recalc_metrics (
    name text NOT NULL,
    label text NOT NULL DEFAULT '',
    value double precision NOT NULL DEFAULT 0,
    updated_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (name, label)
);
