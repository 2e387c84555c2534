"""A session's files with no worker: backup, restore, salvage, repair, fork and trash."""
