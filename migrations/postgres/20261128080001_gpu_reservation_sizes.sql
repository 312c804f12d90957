-- What a hold takes on its GPU as HAMi will account it, as
-- migrations/20261128080001_gpu_reservation_sizes.sql adds it on SQLite.
ALTER TABLE gpu_reservations ADD COLUMN mem_mib BIGINT NOT NULL DEFAULT 0;
ALTER TABLE gpu_reservations ADD COLUMN cores BIGINT NOT NULL DEFAULT 0;
