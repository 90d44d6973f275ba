"""The platform-neutral conversation core: what every message, reaction and button press means."""
