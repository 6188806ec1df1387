"""Live panels in a dock: Memory, Speed, Speculative (see `dock.LivePanels`)."""
