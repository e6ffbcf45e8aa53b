"""Tests: vllm."""
