"""The Shoal agent: the daemon on every host, and the ``shoal`` command line."""
