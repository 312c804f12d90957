-- The rolling error of a serving model (read at start-up and after every publish) looks up
-- the newest runs it predicted; without this index that is a scan of every run of the GPU
-- model (seconds at 1 000 000 runs).
CREATE INDEX observations_by_prediction ON observations (gpu, predicted_by_version, id);
