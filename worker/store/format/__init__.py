"""The log's bytes: record types, their fields and codecs, the checksum chain."""
