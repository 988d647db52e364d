"""The client side: the API client, fail-over, the fleet file, revocations, fit, forecasts, terminal
helpers."""
