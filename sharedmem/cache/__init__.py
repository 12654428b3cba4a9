"""The client's Markdown cache: its files and manifest, the published layout, the search index."""
