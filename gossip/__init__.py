"""Membership and signed record dissemination (SWIM + Lifeguard). Knows nothing of GPUs or jobs."""
