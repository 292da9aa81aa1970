"""Synthetic models for tests and benches: seeded GGUF files of every architecture."""
