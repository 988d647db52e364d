"""The one content-addressed store per node: manifests of chunks, the chunks kept by digest, and
the one transfer that moves them between agents (datasets, working folders, environments, images
and checkpoints)."""
