"""What llama.cpp makes of a loaded model's vocabulary, as the draft pairing compares it.

`runtime.gguf.vocab` reads the same facts from a file's header (the library's pairing,
before anything loads); this reads them from a loaded model, through llama.cpp's vocabulary
API, which is what llama.cpp's own draft compatibility check reads: 49k tokens take ~50 ms,
the GGUF reader ~2 s.

    check_draft_compat(tokenizer_facts(target), tokenizer_facts(draft))   # [] when they pair
"""

from __future__ import annotations

import llama_cpp.llama_cpp as L

from runtime.gguf.vocab import TokenizerFacts
from runtime.llama.binding import LlamaModel

# enum llama_vocab_type → the names TokenizerFacts uses (llama.h)
_VOCAB_TYPES = {0: "none", 1: "spm", 2: "bpe", 3: "wpm", 4: "ugm", 5: "rwkv", 6: "plamo2"}


# enum llama_vocab_type llama_vocab_type(const struct llama_vocab * vocab);
# const char * llama_vocab_get_text(const struct llama_vocab * vocab, llama_token token);
# bool llama_vocab_get_add_bos(const struct llama_vocab * vocab);  (and _add_eos)
def tokenizer_facts(model: LlamaModel) -> TokenizerFacts:
    """A loaded model's tokenizer facts."""
    vocab = model.vocab
    kind = int(L.llama_vocab_type(vocab))
    tokens = tuple((L.llama_vocab_get_text(vocab, t) or b"") for t in range(model.n_vocab))
    return TokenizerFacts(
        vocab_type=_VOCAB_TYPES.get(kind, f"type {kind}"),
        bos_id=model.bos if model.bos >= 0 else None,
        eos_id=model.eos if model.eos >= 0 else None,
        add_bos=bool(L.llama_vocab_get_add_bos(vocab)),
        add_eos=bool(L.llama_vocab_get_add_eos(vocab)),
        tokens=tokens)
