"""kvoffload's own tests."""
