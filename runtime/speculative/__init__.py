"""Speculative decoding's self-contained parts: drafters, the draft-model compatibility
check, the adaptive draft length and the per-reply statistics. The verify step itself is
`runtime.verify` (numpy reference) and `runtime.native.verify` (native when built)."""
