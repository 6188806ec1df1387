"""Chat formats: which tool-call and reasoning family a chat template belongs to
(`families`), and the parsing of a model's reply in that family's format (`reply`,
`tool_grammar`). Pure text: no engine, binding or sampler imports."""
