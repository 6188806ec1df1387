"""Outrider's own routes: load and unload, status, metrics, tokenize."""
