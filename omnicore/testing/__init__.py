"""Helpers for testing omnicore and its plugins (also a pytest plugin: :mod:`omnicore.testing.pytest_plugin`)."""
