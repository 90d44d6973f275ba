"""deepthread's settings: one pydantic-settings class read by every component."""

from config.settings import Settings, SettingsError, get_settings, load_settings

__all__ = ["Settings", "SettingsError", "get_settings", "load_settings"]
