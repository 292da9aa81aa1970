"""The TUI's screens: the chat (with its actions and model loading), the chat list, settings, the model picker."""
