"""The inbox: chat messages made durable before the platform gets its 2xx, then processed
by whichever replica is alive, one chat at a time, in arrival order."""
