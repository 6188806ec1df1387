"""Settings: the app's own (folders, Hub, token, server, theme) and each model's load settings."""
