-- A sample's, and an agentic turn's, trained tokens with the student's and its teachers'
-- log-probs (JSON object: pieces, student, teachers); NULL when the run recorded none (only
-- on-policy distillation does).
ALTER TABLE samples ADD COLUMN tokens TEXT;
ALTER TABLE turns ADD COLUMN tokens TEXT;
