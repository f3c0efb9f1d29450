"""The aiohttp application: one app, every HTTP route of DESIGN §6."""
