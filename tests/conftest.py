"""Shared fixtures for the test suite (the XLA flag lives in the root conftest.py)."""
