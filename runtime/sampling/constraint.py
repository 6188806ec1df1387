"""Constrained decoding: what a sequence may generate next, from a `ConstraintSpec`.

Built on llguidance (a byte-level Earley parser with a lexer over the token trie: ~0.02 ms
a mask for a 10-field object schema on SmolLM2's 49k vocabulary when its tables are in
cache, 0.1-0.2 ms in the engine, where each decode has just streamed the model's weights
through the caches). Three pieces:

- `check_spec(spec)` — tokenizer-free validation, for the server to answer 400 before the
  engine sees the request; a one-line `ConstraintError` that names what is wrong and where
  (runtime.sampling.grammar, which turns specs into grammars, says which specs are refused):

      >>> check_spec(ConstraintSpec("gbnf", 'root ::= ("yes" | "no"'))
      Traceback (most recent call last):
      runtime.errors.ConstraintError: the GBNF grammar does not parse: Expected ')' at line 1, ...

- `ConstraintCompiler` — one per loaded model: llguidance's tokenizer over the model's
  vocabulary (built once, on the first constrained request: ~0.5 s for 49k tokens) and a
  small LRU of compiled grammars keyed by the spec, so the second request with a schema
  pays only a copy.
- `Constraint` — one per sequence: `mask()` is the `TokenMask` (runtime.sampling.token_mask)
  of the tokens that may come next (None: anything; `allowed()` the same as a bool array),
  `advance(token)` after a token is accepted (`try_advance` for a
  draft token that may be refused), `rollback(n)` for rejected drafts, `fork()` for the
  other samples of n > 1, and `done` once the grammar is complete and nothing but the end
  may follow (the scheduler then finishes with "stop").

      c = compiler.start(ConstraintSpec("regex", "[0-9]{3}"))
      c.allowed()[token_of("7")]   # True
      c.advance(token_of("7")); c.advance(token_of("42"))
      c.done                       # True: "742" is complete, the reply ends there

Lazy constraints (`spec.trigger`, for tool calls under `tool_choice: auto`): free text until
the trigger's text appears in the output; then the text from the trigger's first byte on
must match the grammar, so the grammar starts with the trigger itself. When the trigger
begins on a token boundary its tokens are fed to the grammar as they are (a special token
stays special); otherwise, or when the grammar spells the trigger as plain text, the bytes
from the trigger on are re-tokenized and fed. Text after the trigger that the grammar
refuses is a ConstraintError (llama.cpp's lazy grammars fail the same way). Rollback works
across the point where the trigger fired. With `spec.armed_after` (a reasoning reply's
`</think>`) the trigger counts only after that text: a call marker named while the model
thinks is just thinking.

Masks are cached per position along the path of tokens they were computed for: a draft
model computes the masks while it drafts, the verifier meets the same states again for free.
And the same mask met at another position (or by another sequence of the model) is the same
`TokenMask` object, from the compiler's `MaskTable`.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any, Protocol

import llguidance
import numpy as np
from llguidance.numpy import allocate_token_bitmask

from runtime.errors import ConstraintError
from runtime.events import ConstraintSpec
from runtime.sampling.grammar import (
    check_forced,
    check_spec,
    explain,
    grammar_of,
    matcher_error,
    one_line,
)
from runtime.sampling.token_mask import MaskTable, TokenMask

__all__ = ["CACHE_SIZE", "Constraint", "ConstraintCompiler", "check_spec"]

CACHE_SIZE = 16  # compiled grammars kept per model
_MASK_HISTORY = 64  # masks kept behind the current position (drafts roll back at most k)


class LlamaModelLike(Protocol):
    """What `ConstraintCompiler.from_llama` reads of runtime.llama.binding.LlamaModel: the
    binding reads llama.cpp's vocabulary, this module only hands it to llguidance."""

    vocab: Any
    n_vocab: int
    eos: int

    def is_eog(self, token: int) -> bool: ...

    def marked_pieces(self) -> list[bytes]: ...

    @property
    def tokenize_address(self) -> int: ...


# ---- compiling -------------------------------------------------------------------------------

class ConstraintCompiler:
    """Turns specs into `Constraint`s for one model's vocabulary. Thread-safe: the engine
    compiles on its preparation workers, off the engine thread.

    `tokenizer` is an `llguidance.LLTokenizer`, or a function that makes one (called once,
    on the first `start`)."""

    def __init__(self, tokenizer: llguidance.LLTokenizer | Callable[[], llguidance.LLTokenizer],
                 n_vocab: int | None = None) -> None:
        self._make = tokenizer if callable(tokenizer) else None
        self._tokenizer = None if callable(tokenizer) else tokenizer
        self._n_vocab = n_vocab
        self._pieces: list[bytes] = []
        self._table: MaskTable | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, str], llguidance.LLMatcher] = OrderedDict()

    @classmethod
    def from_llama(cls, model: LlamaModelLike) -> ConstraintCompiler:
        """The compiler for a loaded model; its tokenizer is read from the vocabulary on
        first use. Every end-of-generation token counts as the grammar's end."""
        def make() -> llguidance.LLTokenizer:
            eog = [t for t in range(model.n_vocab) if model.is_eog(t)] or [max(model.eos, 0)]
            return llguidance.LLTokenizer.from_llamacpp(  # type: ignore[attr-defined]
                tokens=model.marked_pieces(), vocab_ptr=model.vocab,
                tokenize_fptr=model.tokenize_address, eos_token=eog, slices=None)

        return cls(make, model.n_vocab)

    def _vocabulary(self) -> tuple[llguidance.LLTokenizer, list[bytes], MaskTable]:
        with self._lock:
            if self._tokenizer is None:
                assert self._make is not None
                self._tokenizer = self._make()
            tok = self._tokenizer
            if not self._pieces:
                # decode_bytes gives special tokens' text too (what the trigger search reads)
                self._pieces = [tok.decode_bytes([t]) for t in range(tok.vocab_size)]
            if self._table is None:
                self._table = MaskTable(self._n_vocab or tok.vocab_size)
            return tok, self._pieces, self._table

    def start(self, spec: ConstraintSpec) -> Constraint:
        """A fresh constraint for one sequence; raises ConstraintError."""
        tok, pieces, table = self._vocabulary()
        key = (spec.kind, spec.source)
        with self._lock:
            template = self._cache.get(key)
            if template is not None:
                self._cache.move_to_end(key)
                matcher = template.deep_copy()
        if template is None:
            grammar = grammar_of(spec)
            template = llguidance.LLMatcher(tok, grammar, log_level=0)
            if template.is_error():
                raise ConstraintError(explain(spec, template.get_error()))
            check_forced(template)
            with self._lock:
                self._cache[key] = template
                while len(self._cache) > CACHE_SIZE:
                    self._cache.popitem(last=False)
                matcher = template.deep_copy()
        trigger = spec.trigger.encode("utf-8") if spec.trigger else None
        armed_after = spec.armed_after.encode("utf-8") if spec.armed_after and trigger else None
        return Constraint(matcher, tok, pieces, table, trigger, armed_after)


# ---- one sequence's constraint ---------------------------------------------------------------

class Constraint:
    """The grammar state of one sequence (see the module docstring)."""

    def __init__(self, matcher: llguidance.LLMatcher, tokenizer: llguidance.LLTokenizer,
                 pieces: list[bytes], table: MaskTable, trigger: bytes | None,
                 armed_after: bytes | None = None) -> None:
        self._matcher = matcher
        self._tok = tokenizer
        self._pieces = pieces
        self._table = table
        self._trigger = trigger
        self._armed_after = armed_after  # the trigger counts only after this text
        self._armed_end: int | None = None  # where in _text it ended, once seen
        self._tokens: list[int] = []  # every advance, in order
        self._fed: list[int] = []  # matcher tokens each advance consumed (0: free text)
        self._fired_at: int | None = None if trigger else -1  # advance that fired the trigger
        self._text = bytearray()  # lazy only: the text generated before the trigger fired
        self._masks: dict[int, TokenMask] = {}  # position -> its mask, along _mask_path
        self._mask_path: list[int] = []
        self._bits = allocate_token_bitmask(1, tokenizer.vocab_size)
        # llguidance.numpy.fill_next_token_bitmask checks and slices the array and asks numpy
        # for its address on every call: ~150 µs a mask right after a decode (cold caches),
        # as much as the mask itself. The buffer never moves, so the address is taken once.
        self._bits_at = (self._bits.ctypes.data, self._bits.nbytes)

    @property
    def active(self) -> bool:
        """The grammar is in force (always, unless a lazy trigger has not appeared yet)."""
        return self._fired_at is not None

    @property
    def done(self) -> bool:
        """The grammar is complete and allows nothing more but the end of the text."""
        return self.active and self._matcher.is_stopped()

    def mask(self) -> TokenMask | None:
        """The tokens that may come next; None while free (shared: read-only)."""
        return self._entry()

    def allowed(self) -> np.ndarray | None:
        """Bool mask (n_vocab,) of the tokens that may come next; None while free. Read-only
        (shared with the cache)."""
        entry = self._entry()
        return None if entry is None else entry.as_bool()

    def allowed_ids(self) -> np.ndarray | None:
        """The same as the ids it allows (ascending int64; read-only), None while free."""
        entry = self._entry()
        return None if entry is None else entry.allowed_ids()

    def _entry(self) -> TokenMask | None:
        if not self.active:
            return None
        depth = len(self._tokens)
        entry = self._masks.get(depth)
        if entry is not None:
            return entry
        self._matcher.unsafe_compute_mask_ptr(*self._bits_at)
        if self._matcher.is_error():
            raise ConstraintError(matcher_error(self._matcher.get_error()))
        entry = self._table.get(self._bits)
        if not entry.count:
            raise ConstraintError("the grammar allows no token here")
        self._masks[depth] = entry
        self._masks.pop(depth - _MASK_HISTORY, None)
        return entry

    def advance(self, token: int) -> None:
        """`token` was accepted. Raises ConstraintError when the grammar does not allow it
        (the state stays as it was) or fails inside (it stays failed)."""
        depth = len(self._tokens)
        if not self.active:
            fed = self._advance_free(token)
        else:
            if self._matcher.try_consume_tokens([token]) != 1:
                if self._matcher.is_error():
                    raise ConstraintError(matcher_error(self._matcher.get_error()))
                raise ConstraintError(f"the grammar does not allow token {token} "
                                      f"({self._piece(token)!r}) here")
            fed = 1
        self._tokens.append(token)
        self._fed.append(fed)
        # Masks computed further along another path no longer apply.
        if depth < len(self._mask_path) and self._mask_path[depth] != token:
            del self._mask_path[depth:]
            for key in [k for k in self._masks if k > depth]:
                del self._masks[key]
        if depth == len(self._mask_path):
            self._mask_path.append(token)

    def try_advance(self, token: int) -> bool:
        """Advance when the grammar allows `token` here; False (state unchanged) when it
        does not — how drafters and the verifier step through draft tokens tentatively.

        No mask is computed: the parser is asked about this one token (~2 µs, where a mask
        costs 30-200 µs). The parser accepts a few tokens the mask leaves out (a prefix of a
        forced key, such as "c" where the key "city" must come), so a draft may step through
        one the sampler would never pick; the verifier's row there has p = 0 for it, it is
        rejected there, and the rows after it are never read."""
        try:
            self.advance(token)
        except ConstraintError:  # refused, or a lazy trigger followed by text that does not fit
            return False
        return True

    def forced(self) -> list[int]:
        """The tokens every continuation from here begins with (llguidance's fast-forward
        tokens: the forced bytes, tokenized, short of where the next token could merge
        differently); [] while free or when nothing is forced. After `{"name": "Ann", ` in
        an object whose next key is "city", the tokens of `"city": "`. Free drafts."""
        if not self.active or self._matcher.is_stopped():
            return []
        return list(self._matcher.compute_ff_tokens())

    def _advance_free(self, token: int) -> int:
        """Lazy, before the trigger: record the text; fire when the trigger appears."""
        assert self._trigger is not None
        piece = self._piece(token)
        start = max(0, len(self._text) - len(self._trigger) + 1)
        self._text += piece
        if self._armed_after is not None:
            if self._armed_end is None:
                look = max(0, len(self._text) - len(piece) - len(self._armed_after) + 1)
                found = self._text.find(self._armed_after, look)
                if found < 0:
                    return 0
                self._armed_end = found + len(self._armed_after)
            start = max(start, self._armed_end)
        at = self._text.find(self._trigger, start)
        if at < 0:
            return 0
        try:
            fed = self._fire(at, token)
        except ConstraintError:
            del self._text[len(self._text) - len(piece):]
            raise
        self._fired_at = len(self._tokens)
        return fed

    def _fire(self, at: int, token: int) -> int:
        """Feed the text from byte `at` (where the trigger starts) to the grammar: the
        tokens themselves when `at` is a token boundary, else (or if the grammar refuses
        them) the bytes re-tokenized. How many matcher tokens were consumed."""
        tokens = [*self._tokens, token]
        offset, first = 0, len(tokens)
        for i, t in enumerate(tokens):  # the token holding byte `at`
            if offset + len(self._piece(t)) > at:
                first = i
                break
            offset += len(self._piece(t))
        attempts = []
        if offset == at:
            attempts.append(tokens[first:])
        attempts.append(self._tok.tokenize_bytes(bytes(self._text[at:])))
        for feed in attempts:
            n = self._matcher.try_consume_tokens(feed)
            if n == len(feed):
                return n
            if n:
                self._matcher.rollback(n)
        trigger = (self._trigger or b"").decode("utf-8", "replace")
        raise ConstraintError(one_line(
            f"the output after the trigger {trigger!r} does "
            f"not match the grammar: {bytes(self._text[at:]).decode('utf-8', 'replace')!r}"))

    def rollback(self, n: int) -> None:
        """Undo the last `n` advances (rejected draft tokens)."""
        if not 0 <= n <= len(self._tokens):
            raise ValueError(f"cannot roll back {n} of {len(self._tokens)} tokens")
        for _ in range(n):
            token = self._tokens.pop()
            fed = self._fed.pop()
            if fed:
                self._matcher.rollback(fed)
            if self._trigger is None:
                continue
            if self._fired_at == len(self._tokens):
                self._fired_at = None
            if self._fired_at is None:
                size = len(self._piece(token))
                del self._text[len(self._text) - size:]
                if self._armed_end is not None and self._armed_end > len(self._text):
                    self._armed_end = None

    def fork(self) -> Constraint:
        """An independent copy in the same state (another sample of the same request)."""
        twin = Constraint(self._matcher.deep_copy(), self._tok, self._pieces, self._table,
                          self._trigger, self._armed_after)
        twin._armed_end = self._armed_end
        twin._tokens = list(self._tokens)
        twin._fed = list(self._fed)
        twin._fired_at = self._fired_at
        twin._text = bytearray(self._text)
        twin._masks = dict(self._masks)
        twin._mask_path = list(self._mask_path)
        return twin

    def _piece(self, token: int) -> bytes:
        return self._pieces[token] if 0 <= token < len(self._pieces) else b""
