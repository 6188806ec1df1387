"""The other pages of the main window: Server, first run, and placeholders."""
