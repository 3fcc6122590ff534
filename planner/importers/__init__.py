"""Importers of profiles in other tools' formats (no torch)."""
