"""The Chat page: conversations, transcript, composer, model picker (see `page.ChatPage`)."""
