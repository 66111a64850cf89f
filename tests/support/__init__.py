"""Test support code (stub upstream, helpers)."""
