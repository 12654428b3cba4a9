"""The server end (`serve`): the session, the SQLite store, ingest, the schema, backups."""
