"""Both installers and what they write: the prefix, authorized keys, harness files, guidance, the schedule."""
