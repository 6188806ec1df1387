"""The Models page: Hub search, each repository's quants with fit badges, downloads, library."""
