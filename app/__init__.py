"""Outrider's desktop app (PySide6).

The app never runs inference itself: it starts the engine server (`runtime.cli.main serve`) as a
child process and talks to it over loopback HTTP (`app.engine.client`), so a llama.cpp abort
cannot take the window and the user's chats with it. Qt imports go through `app.qt`.
"""
