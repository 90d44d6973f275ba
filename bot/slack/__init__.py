"""The Slack adapter: slack-bolt listeners (`app`), event dedupe (`dedupe`), and running the bot (`server`)."""
