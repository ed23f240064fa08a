-- The experiment store (see src/store.rs). Times are Unix milliseconds (UTC).

CREATE TABLE runs (
    id            INTEGER PRIMARY KEY,
    name          TEXT    NOT NULL UNIQUE,
    status        TEXT    NOT NULL CHECK (status IN ('running', 'finished', 'failed', 'interrupted')),
    created_at    INTEGER NOT NULL,
    updated_at    INTEGER NOT NULL,
    -- Refreshed by the writing process every few seconds; a stale heartbeat means the process died.
    heartbeat_at  INTEGER NOT NULL,
    config_json   TEXT    NOT NULL,
    config_hash   TEXT    NOT NULL,
    git_revision  TEXT,
    seed          INTEGER NOT NULL,
    output_dir    TEXT    NOT NULL,
    notes         TEXT    NOT NULL DEFAULT '',
    -- The process that owns a running run: host name, pid, and a token (boot id, pid namespace and the
    -- pid's start time) that tells it apart from a later process with the same pid.
    host          TEXT,
    pid           INTEGER,
    process_token TEXT,
    last_stage    TEXT,
    last_step     INTEGER NOT NULL DEFAULT 0,
    error         TEXT
);

CREATE TABLE run_tags (
    run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    tag    TEXT    NOT NULL,
    PRIMARY KEY (run_id, tag)
) WITHOUT ROWID;

-- One metric of one stage of one run. `points`, `last_step` and `last_value` summarise its chunks.
CREATE TABLE metric_series (
    id         INTEGER PRIMARY KEY,
    run_id     INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    stage      TEXT    NOT NULL,
    key        TEXT    NOT NULL,
    points     INTEGER NOT NULL DEFAULT 0,
    last_step  INTEGER,
    last_value REAL,
    UNIQUE (run_id, stage, key)
);

-- Points of a series, packed: `data` holds `points` records of 24 bytes, little-endian
-- (step u64, wall_time f64 seconds since the run started, value f64), in step order.
CREATE TABLE metric_chunks (
    id         INTEGER PRIMARY KEY,
    series_id  INTEGER NOT NULL REFERENCES metric_series (id) ON DELETE CASCADE,
    first_step INTEGER NOT NULL,
    last_step  INTEGER NOT NULL,
    points     INTEGER NOT NULL,
    data       BLOB    NOT NULL
);
CREATE INDEX metric_chunks_by_series ON metric_chunks (series_id, first_step);

CREATE TABLE samples (
    id               INTEGER PRIMARY KEY,
    run_id           INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    stage            TEXT    NOT NULL,
    step             INTEGER NOT NULL,
    domain           TEXT    NOT NULL,
    prompt           TEXT    NOT NULL,
    response         TEXT    NOT NULL,
    ground_truth     TEXT    NOT NULL,
    prompt_tokens    INTEGER NOT NULL,
    response_tokens  INTEGER NOT NULL,
    -- Reals may be NULL: SQLite stores NaN as NULL (a diverging run still records its samples).
    reward           REAL,
    correct          INTEGER NOT NULL,
    -- JSON object: the parts the reward was made of, by name.
    reward_breakdown TEXT    NOT NULL,
    advantage        REAL,
    policy_version   INTEGER NOT NULL,
    finish_reason    TEXT    NOT NULL
);
CREATE INDEX samples_by_step ON samples (run_id, stage, step);

CREATE TABLE trajectories (
    id             INTEGER PRIMARY KEY,
    run_id         INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    stage          TEXT    NOT NULL,
    step           INTEGER NOT NULL,
    env            TEXT    NOT NULL,
    env_seed       INTEGER NOT NULL,
    policy_version INTEGER NOT NULL,
    total_reward   REAL,
    success        INTEGER NOT NULL
);
CREATE INDEX trajectories_by_step ON trajectories (run_id, stage, step);

CREATE TABLE turns (
    trajectory_id   INTEGER NOT NULL REFERENCES trajectories (id) ON DELETE CASCADE,
    turn            INTEGER NOT NULL,
    observation     TEXT    NOT NULL,
    action_text     TEXT    NOT NULL,
    -- NULL when the action text could not be parsed.
    parsed_action   TEXT,
    reward          REAL,
    done            INTEGER NOT NULL,
    prompt_tokens   INTEGER NOT NULL,
    response_tokens INTEGER NOT NULL,
    PRIMARY KEY (trajectory_id, turn)
) WITHOUT ROWID;

CREATE TABLE checkpoints (
    id         INTEGER PRIMARY KEY,
    run_id     INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE,
    stage      TEXT    NOT NULL,
    step       INTEGER NOT NULL,
    path       TEXT    NOT NULL,
    bytes      INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (run_id, stage, step)
);

CREATE TABLE events (
    id         INTEGER PRIMARY KEY,
    run_id     INTEGER REFERENCES runs (id) ON DELETE CASCADE,
    at         INTEGER NOT NULL,
    kind       TEXT    NOT NULL CHECK (kind IN ('run_started', 'run_resumed', 'run_ended', 'worker_started',
                   'worker_exited', 'worker_failed', 'offload', 'reload', 'info', 'warning', 'error')),
    worker     TEXT,
    device     TEXT,
    bytes      INTEGER,
    duration_s REAL,
    message    TEXT    NOT NULL DEFAULT ''
);
CREATE INDEX events_by_run ON events (run_id, at);
