-- Typed events: a worker's role, index and pid, the call phase of a failure and the status a run
-- ended with become columns, and a run the store found without its process gets a kind of its
-- own, so readers never parse message text. The table is rebuilt (SQLite cannot change a CHECK); rows written before this
-- migration get the fields recovered from the text those versions wrote.
CREATE TABLE events_typed (
    id           INTEGER PRIMARY KEY,
    run_id       INTEGER REFERENCES runs (id) ON DELETE CASCADE,
    at           INTEGER NOT NULL,
    kind         TEXT    NOT NULL CHECK (kind IN ('run_started', 'run_resumed', 'run_ended',
                     'run_marked_interrupted', 'worker_started', 'worker_exited', 'worker_failed',
                     'offload', 'reload', 'info', 'warning', 'error')),
    role         TEXT,
    worker_index INTEGER,
    pid          INTEGER,
    phase        TEXT,
    run_status   TEXT    CHECK (run_status IN ('finished', 'interrupted', 'failed')),
    worker       TEXT,
    device       TEXT,
    bytes        INTEGER,
    duration_s   REAL,
    message      TEXT    NOT NULL DEFAULT ''
);

INSERT INTO events_typed (id, run_id, at, kind, role, worker_index, pid, phase, run_status, worker,
                          device, bytes, duration_s, message)
SELECT id, run_id, at,
       CASE WHEN kind = 'warning' AND worker IS NULL AND message LIKE 'run marked interrupted%'
            THEN 'run_marked_interrupted' ELSE kind END,
       -- Workers were named 'role-index'; offloads and reloads named the role alone.
       CASE WHEN worker IS NULL THEN NULL
            WHEN instr(worker, '-') > 0 THEN substr(worker, 1, instr(worker, '-') - 1)
            ELSE worker END,
       CASE WHEN instr(coalesce(worker, ''), '-') > 0
            THEN CAST(substr(worker, instr(worker, '-') + 1) AS INTEGER) END,
       -- 'started, pid 42', 'pid 42 exited (…)', 'pid 42 died (…)'.
       CASE WHEN kind = 'worker_started' AND message LIKE 'started, pid %'
                THEN CAST(substr(message, 14) AS INTEGER)
            WHEN kind IN ('worker_exited', 'worker_failed') AND message LIKE 'pid %'
                THEN CAST(substr(message, 5) AS INTEGER) END,
       -- 'offload actor_train 1024 bytes in 0.010 s (phase train)'.
       CASE WHEN kind IN ('offload', 'reload') AND instr(message, '(phase ') > 0
            THEN rtrim(substr(message, instr(message, '(phase ') + 7), ')') END,
       -- 'run finished', 'run interrupted', 'run failed: …', 'run marked interrupted: …'.
       CASE WHEN kind = 'run_ended' AND message LIKE 'run finished%' THEN 'finished'
            WHEN kind = 'run_ended' THEN 'interrupted'
            WHEN kind = 'error' AND worker IS NULL AND message LIKE 'run failed%' THEN 'failed'
            WHEN kind = 'warning' AND worker IS NULL AND message LIKE 'run marked interrupted%'
                THEN 'interrupted' END,
       worker, device, bytes, duration_s, message
FROM events;

DROP TABLE events;
ALTER TABLE events_typed RENAME TO events;
CREATE INDEX events_by_run ON events (run_id, at);
