"""The Mattermost bot: REST/WebSocket client, the single-holder listener, its health
flag and reconnect backoff."""
