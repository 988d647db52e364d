"""Widgets of the operator TUI: the views, the header and the command bar."""
