"""deepthread's settings: one pydantic-settings class read by every component."""

from config.settings import Settings, SettingsError, get_settings, load_settings, setting_default

__all__ = ["Settings", "SettingsError", "get_settings", "load_settings", "setting_default"]
