"""What loopd's processes agree on: frames, the peer, heartbeat page, lease deadline, TLS rules."""
