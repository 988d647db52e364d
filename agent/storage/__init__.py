"""The agent's SQLite store and what it purges."""
