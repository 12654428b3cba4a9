"""The client's sources: the three source kinds, the walk, and link-safe file access, giving snapshots."""
