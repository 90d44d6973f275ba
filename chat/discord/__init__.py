"""Discord: message and embed rendering within Discord's limits, and the REST messenger."""
