"""Tests: spec."""
