"""Tests: stateful."""
