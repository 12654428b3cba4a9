"""Credential detection and redaction, used by both ends: the rule table and the scanner."""
