"""Speculative decoding's self-contained parts: drafters, the draft-model compatibility
check, the adaptive draft length and the per-reply statistics. The verify step itself is
`runtime.sampling.verify` (numpy reference) and `runtime.sampling.native.verify` (native when built)."""
