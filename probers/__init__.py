"""Hardware probers: each source turns what a host's GPUs report into typed device records.

Nothing here touches the network, asyncio or the TUI.
"""
