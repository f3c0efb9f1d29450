"""Single-holder leases with fencing tokens in ``lock:`` (the Mattermost listener holds one)."""
