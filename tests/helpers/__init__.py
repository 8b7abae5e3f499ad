"""Test helpers shared across test folders: toy models, marks, fakes."""
