"""Attachments a chat or a request carries: images (checked, normalised for the projector)
and documents (their text, cut into passages, ranked by embeddings)."""
