-- Agentic episodes record their group (episodes started from one seed), their place in it and why
-- they ended; turns record what the environment reported (JSON object).
ALTER TABLE trajectories ADD COLUMN group_index INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trajectories ADD COLUMN episode_index INTEGER NOT NULL DEFAULT 0;
ALTER TABLE trajectories ADD COLUMN end_reason TEXT NOT NULL DEFAULT '';
ALTER TABLE turns ADD COLUMN info TEXT NOT NULL DEFAULT '{}';
