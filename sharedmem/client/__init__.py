"""The client end: configuration, the sync and its exchange, notes, their outbox, the lock, status."""
