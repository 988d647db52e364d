"""The agent process: wiring, the HTTP API and OpenAPI, commands, calls, reads, metrics, config."""
