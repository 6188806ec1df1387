"""The API dialects the server speaks, each a thin edge: a schema that reads its body into an
`Ask` (`runtime.server.request`), and a writer for its stream, body and errors; every one
answers through `runtime.server.generation.answer`. No dialect imports another.
"""
