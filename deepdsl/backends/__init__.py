"""Backends: executors and emitters of compiled programs."""
