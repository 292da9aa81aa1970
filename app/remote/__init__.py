"""The app as a client of any OpenAI-compatible server: providers from
config.toml (providers.py) and a chat object with ChatSession's interface that
streams through them (client.py, chat.py)."""
