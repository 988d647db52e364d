"""Screens of the operator TUI: the main screen and its dialogs."""
