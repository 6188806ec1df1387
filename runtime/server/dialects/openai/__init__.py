"""OpenAI's API: chat and text completions, models, embeddings."""
