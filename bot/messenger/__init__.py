"""Outbound messages: post, edit and upload on each chat platform (Slack, console; Discord later)."""
