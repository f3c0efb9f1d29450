"""The aiohttp application: one app, every HTTP route."""
