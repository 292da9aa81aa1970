"""The Textual TUI: `run_tui(args)` in app.py is the entry point."""
