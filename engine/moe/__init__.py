"""Mixture-of-Experts pieces: routing and the expert 'switch' layers."""
