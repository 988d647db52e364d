"""The job: its spec, its states, who owns it and who may act on it, its deadlines."""
