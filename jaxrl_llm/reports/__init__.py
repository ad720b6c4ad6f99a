"""Reports built from core diagnostics (tables and PNGs)."""
