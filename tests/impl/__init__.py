"""Tests: impl."""
