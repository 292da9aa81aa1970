"""The TUI's widgets: a message, the prompt input, the status bar, the context meter."""
