-- The node a worker runs on (a cluster's host: an ssh destination or a SLURM node), on its
-- worker_started events; NULL for a worker on the head's machine and for every other event.
ALTER TABLE events ADD COLUMN node TEXT;
