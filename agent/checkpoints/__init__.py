"""Checkpoints as content of the store: a job's folder read in, held, fetched and restored."""
