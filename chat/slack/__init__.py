"""Slack: Block Kit rendering and the Web API messenger."""
