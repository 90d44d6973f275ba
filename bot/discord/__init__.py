"""The Discord bot: discord.py for the gateway and interactions, the REST messenger for everything it posts."""
