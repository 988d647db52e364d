"""Developer tools run from a checkout (never installed with Shoal)."""
