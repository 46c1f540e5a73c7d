package store

// migrations are applied in order; migrations[i] brings the schema from version i to i+1. Never
// edit an applied migration: append a new one.
var migrations = []string{
	// 1: initial schema.
	`
CREATE TABLE api_keys (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL,
	hash        TEXT NOT NULL UNIQUE,
	mask        TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	revoked_at  INTEGER
);

CREATE TABLE templates (
	id               TEXT PRIMARY KEY,
	build_id         TEXT NOT NULL DEFAULT '',
	cpu              INTEGER NOT NULL,
	memory_mb        INTEGER NOT NULL,
	disk_mb          INTEGER NOT NULL,
	envd_version     TEXT NOT NULL DEFAULT '',
	status           TEXT NOT NULL CHECK (status IN ('waiting','building','ready','error')),
	rootfs           TEXT NOT NULL DEFAULT '',
	default_user     TEXT NOT NULL DEFAULT '',
	default_workdir  TEXT NOT NULL DEFAULT '',
	public           INTEGER NOT NULL DEFAULT 0,
	spawn_count      INTEGER NOT NULL DEFAULT 0,
	last_spawned_at  INTEGER,
	created_at       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL
);

-- Aliases (E2B "names", e.g. "base", "ns/name", "name:tag") are unique across templates.
CREATE TABLE template_aliases (
	alias        TEXT PRIMARY KEY,
	template_id  TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
	position     INTEGER NOT NULL
);
CREATE INDEX template_aliases_template ON template_aliases(template_id, position);

CREATE TABLE sandboxes (
	id                     TEXT PRIMARY KEY,
	template_id            TEXT NOT NULL,
	alias                  TEXT NOT NULL DEFAULT '',
	state                  TEXT NOT NULL CHECK (state IN ('creating','running','paused','killed')),
	metadata               TEXT NOT NULL DEFAULT '{}',
	env_vars               TEXT NOT NULL DEFAULT '{}',
	envd_access_token      TEXT NOT NULL DEFAULT '',
	traffic_access_token   TEXT NOT NULL DEFAULT '',
	allow_public_traffic   INTEGER NOT NULL DEFAULT 1,
	allow_internet_access  INTEGER,
	cpu                    INTEGER NOT NULL,
	memory_mb              INTEGER NOT NULL,
	disk_mb                INTEGER NOT NULL,
	envd_version           TEXT NOT NULL DEFAULT '',
	started_at             INTEGER NOT NULL,
	end_at                 INTEGER NOT NULL,
	killed_at              INTEGER,
	kill_reason            TEXT NOT NULL DEFAULT '',
	node_id                TEXT NOT NULL DEFAULT '',
	network                TEXT NOT NULL DEFAULT '{}'
);
-- Listing pages by (started_at, id) within a state.
CREATE INDEX sandboxes_state_started ON sandboxes(state, started_at, id);
`,
	// 2: template builds and tags (templates built from steps; a tag names one build).
	`
CREATE TABLE template_builds (
	id               TEXT PRIMARY KEY,
	template_id      TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
	status           TEXT NOT NULL CHECK (status IN ('waiting','building','ready','error')),
	reason_message   TEXT NOT NULL DEFAULT '',
	reason_step      TEXT NOT NULL DEFAULT '',
	cpu              INTEGER NOT NULL,
	memory_mb        INTEGER NOT NULL,
	disk_mb          INTEGER NOT NULL DEFAULT 0,
	default_user     TEXT NOT NULL DEFAULT '',
	default_workdir  TEXT NOT NULL DEFAULT '',
	created_at       INTEGER NOT NULL,
	updated_at       INTEGER NOT NULL,
	finished_at      INTEGER
);
CREATE INDEX template_builds_template ON template_builds(template_id, created_at);

CREATE TABLE template_tags (
	template_id  TEXT NOT NULL REFERENCES templates(id) ON DELETE CASCADE,
	tag          TEXT NOT NULL,
	build_id     TEXT NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
	created_at   INTEGER NOT NULL,
	PRIMARY KEY (template_id, tag)
);
`,
	// 3: stateful sandboxes: what happens at expiry, and the state of a pause.
	`
ALTER TABLE sandboxes ADD COLUMN auto_pause INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN auto_pause_memory INTEGER NOT NULL DEFAULT 1;
ALTER TABLE sandboxes ADD COLUMN auto_resume INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_at INTEGER;
ALTER TABLE sandboxes ADD COLUMN paused_memory INTEGER NOT NULL DEFAULT 0;
ALTER TABLE sandboxes ADD COLUMN paused_bytes INTEGER NOT NULL DEFAULT 0;
`,
	// 4: snapshots of running sandboxes (E2B addresses them like templates).
	`
CREATE TABLE snapshots (
	id           TEXT PRIMARY KEY,
	name         TEXT UNIQUE,
	sandbox_id   TEXT NOT NULL,
	template_id  TEXT NOT NULL,
	alias        TEXT NOT NULL DEFAULT '',
	cpu          INTEGER NOT NULL,
	memory_mb    INTEGER NOT NULL,
	disk_mb      INTEGER NOT NULL,
	env_vars     TEXT NOT NULL DEFAULT '{}',
	envd_version TEXT NOT NULL DEFAULT '',
	bytes        INTEGER NOT NULL DEFAULT 0,
	node_id      TEXT NOT NULL DEFAULT '',
	created_at   INTEGER NOT NULL
);
CREATE INDEX snapshots_created ON snapshots(created_at, id);
CREATE INDEX snapshots_sandbox ON snapshots(sandbox_id, created_at);
`,
	// 5: volumes, and the volumes each sandbox mounts.
	`
CREATE TABLE volumes (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL UNIQUE,
	token       TEXT NOT NULL,
	created_at  INTEGER NOT NULL
);
ALTER TABLE sandboxes ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';
ALTER TABLE snapshots ADD COLUMN volume_mounts TEXT NOT NULL DEFAULT '[]';
`,
	// 6: secrets; the value of the current version, sealed (internal/secrets).
	`
CREATE TABLE secrets (
	id          TEXT PRIMARY KEY,
	name        TEXT NOT NULL UNIQUE,
	metadata    TEXT NOT NULL DEFAULT '{}',
	version     INTEGER NOT NULL,
	sealed      BLOB NOT NULL,
	created_at  INTEGER NOT NULL,
	updated_at  INTEGER NOT NULL
);
CREATE INDEX secrets_created ON secrets(created_at, id);
`,
	// 7: join tokens for nodes (internal/join): the secret's hash only.
	`
CREATE TABLE join_tokens (
	id          TEXT PRIMARY KEY,
	hash        TEXT NOT NULL,
	created_at  INTEGER NOT NULL,
	expires_at  INTEGER NOT NULL,
	uses_left   INTEGER NOT NULL
);
`,
	// 8: the cluster's nodes as the driver last saw them, and the drains operators asked for.
	`
CREATE TABLE nodes (
	name           TEXT PRIMARY KEY,
	rpc            TEXT NOT NULL DEFAULT '',
	gossip         TEXT NOT NULL DEFAULT '',
	state          TEXT NOT NULL,
	features       TEXT NOT NULL DEFAULT '',
	templates      TEXT NOT NULL DEFAULT '',
	free_slots     INTEGER NOT NULL DEFAULT 0,
	free_memory_mb INTEGER NOT NULL DEFAULT 0,
	free_disk_mb   INTEGER NOT NULL DEFAULT 0,
	load           REAL NOT NULL DEFAULT 0,
	drain          TEXT NOT NULL DEFAULT '',
	seen_at        INTEGER NOT NULL,
	since          INTEGER NOT NULL
);
`,
	// 9: the node a volume lives on (a cluster's; empty in one process).
	`
ALTER TABLE volumes ADD COLUMN node_id TEXT NOT NULL DEFAULT '';
`,
	// 10: what drivers sharing a database need: the cluster's keys, where each driver gossips (so
	// they find each other), and which driver is making a sandbox or running a build (another
	// driver starting must not take them for interrupted).
	`
CREATE TABLE drivers (
	name     TEXT PRIMARY KEY,
	gossip   TEXT NOT NULL,
	seen_at  INTEGER NOT NULL
);
CREATE TABLE cluster_keys (
	name        TEXT PRIMARY KEY,
	value       BLOB NOT NULL,
	created_at  INTEGER NOT NULL
);
ALTER TABLE sandboxes ADD COLUMN driver TEXT NOT NULL DEFAULT '';
ALTER TABLE template_builds ADD COLUMN driver TEXT NOT NULL DEFAULT '';
`,
	// 11: the drivers' part of sandbox logs (the lifecycle), where drivers share a database: any
	// of them reads what another wrote, and a driver that goes away takes none of it along.
	`
CREATE TABLE sandbox_log (
	sandbox_id  TEXT NOT NULL,
	at          INTEGER NOT NULL,
	seq         INTEGER NOT NULL,
	level       INTEGER NOT NULL,
	logger      TEXT NOT NULL,
	message     TEXT NOT NULL,
	fields      TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX sandbox_log_at ON sandbox_log(sandbox_id, at, seq);
`,
	// 12: a template build any driver sharing the database can serve: the tags it was created
	// with, whether a start claimed it (the one driver that runs it), and its log.
	`
ALTER TABLE template_builds ADD COLUMN tags TEXT NOT NULL DEFAULT '[]';
ALTER TABLE template_builds ADD COLUMN started INTEGER NOT NULL DEFAULT 0;
CREATE TABLE build_log (
	build_id  TEXT NOT NULL REFERENCES template_builds(id) ON DELETE CASCADE,
	seq       INTEGER NOT NULL,
	at        INTEGER NOT NULL,
	level     TEXT NOT NULL,
	step      TEXT NOT NULL DEFAULT '',
	message   TEXT NOT NULL,
	PRIMARY KEY (build_id, seq)
);
`,
}
