"""Inbound adapters: signed webhooks, Telegram, Slack, Mattermost."""
