"""Running santa: storage (local/S3), Ray start-up, run locks, error lines, pre-flight checks."""
