"""Inbound events: signed webhooks, jobs, Telegram, Slack, Mattermost."""
