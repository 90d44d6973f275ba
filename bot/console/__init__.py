"""The terminal adapter: `deepthread chat`."""
