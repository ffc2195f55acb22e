"""Offline tools over a database or a folder: copy and check, without a mount."""
