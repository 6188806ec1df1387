"""runtime.sampling.constraint (and runtime.sampling.grammar) on a toy byte-level tokenizer (no
model): spec checking and its messages, masks, advance/rollback/fork, lazy triggers, the
compiled-grammar cache, and the sampler applying the mask."""

from __future__ import annotations

import json
from collections.abc import Sequence

import jsonschema
import llguidance
import numpy as np
import pytest

from runtime.errors import ConstraintError
from runtime.events import ConstraintSpec, SamplingParams
from runtime.sampling import constraint as constraint_module
from runtime.sampling.constraint import Constraint, ConstraintCompiler, check_spec
from runtime.sampling.sampler import Sampler


class ToyTokenizer:
    """256 byte tokens, a few merges (one of them the trigger "<call>") and an end token."""

    MERGES = (b'{"', b'":', b"<call>", b"ab", b'l>{"', b"l>!")

    def __init__(self) -> None:
        self.tokens = [bytes([b]) for b in range(256)] + list(self.MERGES) + [b"\xff<eos>"]
        self.eos_token_id = len(self.tokens) - 1
        self.bos_token_id = None
        self.special_token_ids = [self.eos_token_id]

    def __call__(self, data: bytes | str) -> list[int]:
        raw = data.encode() if isinstance(data, str) else data
        out, i = [], 0
        merges = sorted(((t, 256 + n) for n, t in enumerate(self.MERGES)), key=lambda m: -len(m[0]))
        while i < len(raw):
            for text, token in merges:
                if raw.startswith(text, i):
                    out.append(token)
                    i += len(text)
                    break
            else:
                out.append(raw[i])
                i += 1
        return out


TOY = ToyTokenizer()
EOS = TOY.eos_token_id
CALL = 256 + ToyTokenizer.MERGES.index(b"<call>")
OPEN = 256 + ToyTokenizer.MERGES.index(b'{"')


@pytest.fixture(scope="module")
def compiler() -> ConstraintCompiler:
    return ConstraintCompiler(llguidance.LLTokenizer(llguidance.TokenizerWrapper(TOY)))


def tokens_of(text: str) -> list[int]:
    return TOY(text)


def feed(c: Constraint, tokens: Sequence[int]) -> None:
    for t in tokens:
        c.advance(t)


def random_walk(c: Constraint, rng: np.random.Generator, limit: int = 400) -> bytes:
    """Tokens drawn uniformly from the mask until the grammar is done or allows the end
    (taken with probability 1/2 when it does)."""
    out = b""
    for _ in range(limit):
        mask = c.allowed()
        assert mask is not None
        allowed = np.flatnonzero(mask)
        if mask[EOS] and (allowed.size == 1 or rng.random() < 0.5):
            return out
        choice = int(rng.choice(allowed[allowed != EOS]))
        c.advance(choice)
        out += TOY.tokens[choice]
        if c.done:
            return out
    raise AssertionError(f"no end after {limit} tokens: {out[:80]!r}")


# ---- check_spec --------------------------------------------------------------------------------

@pytest.mark.parametrize("spec", [
    ConstraintSpec("json_object"),
    ConstraintSpec("json_schema", '{"type": "object", "properties": {"a": {"type": "integer"}}}'),
    ConstraintSpec("json_schema", "true"),
    ConstraintSpec("regex", "[0-9]{3}"),
    ConstraintSpec("gbnf", 'root ::= "yes" | "no"'),
    ConstraintSpec("lark", 'start: "x"+'),
    ConstraintSpec("lark", 'start: "<call>" "{}"', trigger="<call>"),
])
def test_valid_specs_pass(spec: ConstraintSpec) -> None:
    check_spec(spec)


@pytest.mark.parametrize(("spec", "message"), [
    (ConstraintSpec("json_schema", '{"type": "object"'),
     "the JSON schema is not valid JSON: Expecting ',' delimiter at line 1 column 18"),
    (ConstraintSpec("json_schema", "[1, 2]"),
     "a JSON schema must be an object (or true/false), not list"),
    (ConstraintSpec("json_schema", json.dumps(
        {"type": "object", "properties": {"tags": {"type": "array", "uniqueItems": True}}})),
     "unsupported keyword 'uniqueItems' at /properties/tags"),
    (ConstraintSpec("json_schema", json.dumps({"not": {"type": "string"}})),
     "unsupported keyword 'not' at the top level"),
    (ConstraintSpec("json_schema", json.dumps(
        {"properties": {"not": {"type": "object", "properties": {"a/b": {"if": {}, "then": {}}}}}})),
     "unsupported keywords 'if', 'then' at /properties/not/properties/a~1b"),
    (ConstraintSpec("json_schema", json.dumps(
        {"$defs": {"x": {"oneOf": [{"type": "number"}, {"type": "integer"}]}}, "$ref": "#/$defs/x"})),
     "unsupported keyword 'oneOf' at /$defs/x: its branches may overlap"),
    (ConstraintSpec("json_schema", json.dumps(
        {"properties": {"when": {"type": "string", "format": "moon-phase"}}})),
     "unsupported format 'moon-phase' at /properties/when/format"),
    (ConstraintSpec("json_schema", json.dumps(
        {"items": {"type": "string", "pattern": "(ab"}, "type": "array"})),
     "the pattern '(ab' at /items/pattern is not a valid regular expression: unclosed group"),
    (ConstraintSpec("json_schema", json.dumps({"type": "strin"})),
     "invalid type 'strin' at /type"),
    (ConstraintSpec("gbnf", 'root ::= ("yes" | "no"'), "the GBNF grammar does not parse: "),
    (ConstraintSpec("gbnf", 'root = "a"'), "the GBNF grammar does not parse: Expected ::="),
    (ConstraintSpec("lark", 'start: ("x"'), "the Lark grammar cannot be compiled: "),
    (ConstraintSpec("regex", "[a-"), "the regular expression cannot be compiled: "),
    (ConstraintSpec("regex", "x+", trigger=""), "a lazy constraint's trigger cannot be empty"),
    (ConstraintSpec("lark", 'start: "x" start'), "the grammar cannot end: it forces"),
    (ConstraintSpec("gbnf", 'root ::= "[" root "]"'), "the grammar cannot end: it forces"),
    (ConstraintSpec("json_schema", "false"), "the JSON schema `false` allows no value"),
])
def test_bad_specs_are_one_line_errors(spec: ConstraintSpec, message: str) -> None:
    with pytest.raises(ConstraintError) as info:
        check_spec(spec)
    text = str(info.value)
    assert text.startswith(message)
    assert "\n" not in text and len(text) <= 300


def test_a_grammar_that_may_go_on_forever_never_allows_the_end(compiler: ConstraintCompiler) -> None:
    """Nothing forced, no derivation ends: accepted; the reply will end with "length"."""
    spec = ConstraintSpec("gbnf", 'root ::= [xy] root')
    check_spec(spec)
    c = compiler.start(spec)
    for token in tokens_of("xyyxxyxyyx" * 5):
        assert not c.allowed()[EOS]
        c.advance(token)
    assert not c.done


def test_special_tokens_are_checked_against_the_model(compiler: ConstraintCompiler) -> None:
    """Lark names special tokens as <name>: check_spec cannot know the model's, the compiler
    can (the toy's end token is "<eos>")."""
    check_spec(ConstraintSpec("lark", 'start: "a" <eos>'))
    check_spec(ConstraintSpec("lark", 'start: "a" <nosuch>'))
    c = compiler.start(ConstraintSpec("lark", 'start: "a" <eos> "b"'))
    c.advance(ord("a"))
    assert np.flatnonzero(c.allowed()).tolist() == [EOS]
    with pytest.raises(ConstraintError, match='unknown special token: "<nosuch>"'):
        compiler.start(ConstraintSpec("lark", 'start: "a" <nosuch>'))


def test_the_compiler_refuses_what_check_spec_refuses(compiler: ConstraintCompiler) -> None:
    spec = ConstraintSpec("json_schema", json.dumps({"type": "array", "uniqueItems": True}))
    with pytest.raises(ConstraintError, match="unsupported keyword 'uniqueItems' at the top level"):
        compiler.start(spec)


def test_x_guidance_cannot_make_the_compiler_lenient() -> None:
    """Ignoring a keyword would be silently unconstrained output."""
    schema = {"x-guidance": {"lenient": True}, "type": "array", "uniqueItems": True}
    with pytest.raises(ConstraintError, match="uniqueItems"):
        check_spec(ConstraintSpec("json_schema", json.dumps(schema)))


# ---- masks and moves ---------------------------------------------------------------------------

def test_a_regex_masks_then_completes(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("regex", "[0-9]{3}"))
    mask = c.allowed()
    assert mask is not None and mask.dtype == np.bool_ and mask.size == len(TOY.tokens)
    assert set(np.flatnonzero(mask)) == set(range(ord("0"), ord("9") + 1))
    feed(c, tokens_of("74"))
    assert not c.done
    c.advance(ord("2"))
    assert c.done
    assert np.flatnonzero(c.allowed()).tolist() == [EOS]  # only the end may follow


def test_the_end_is_allowed_once_the_grammar_accepts(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("regex", "a+"))
    assert not c.allowed()[EOS]
    c.advance(ord("a"))
    mask = c.allowed()
    assert mask[EOS] and mask[ord("a")] and not c.done


def test_a_refused_token_raises_and_leaves_the_state(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("regex", "[0-9]{3}"))
    c.advance(ord("1"))
    with pytest.raises(ConstraintError, match="does not allow token 120"):
        c.advance(ord("x"))
    assert not c.try_advance(ord("x"))
    feed(c, tokens_of("23"))  # the matcher was not left in an error state
    assert c.done


def test_rollback_returns_to_the_earlier_state(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("json_object"))
    feed(c, tokens_of('{"a": 1'))
    before = c.allowed().copy()
    feed(c, tokens_of("}"))
    assert c.done
    c.rollback(1)
    assert not c.done
    assert np.array_equal(c.allowed(), before)
    c.rollback(len(tokens_of('{"a": 1')))
    assert np.flatnonzero(c.allowed()).tolist() == [ord("{"), OPEN]
    with pytest.raises(ValueError):
        c.rollback(1)


def test_masks_are_cached_along_the_path(compiler: ConstraintCompiler) -> None:
    """A drafter's masks serve the verifier: same path, same mask objects."""
    c = compiler.start(ConstraintSpec("json_object"))
    first = c.allowed()
    feed(c, [OPEN])
    second = c.allowed()
    c.rollback(1)
    assert c.allowed() is first
    c.advance(OPEN)
    assert c.allowed() is second
    c.rollback(1)
    c.advance(ord("{"))  # another path: the deeper mask no longer applies
    assert c.allowed() is not second
    assert not c.allowed().flags.writeable


def test_fork_is_independent(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("regex", "(ab|cd)e"))
    c.advance(ord("a"))
    twin = c.fork()
    c.advance(ord("b"))
    assert twin.allowed()[ord("b")] and not twin.allowed()[ord("e")]
    assert c.allowed()[ord("e")]
    twin.rollback(1)
    assert twin.allowed()[ord("c")] and not c.allowed()[ord("c")]


@pytest.mark.parametrize("seed", range(5))
def test_random_walks_under_a_schema_validate(compiler: ConstraintCompiler, seed: int) -> None:
    schema = {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 5}, "n": {"type": "integer"},
        "ok": {"type": "boolean"}, "kind": {"enum": ["a", "b"]},
        "xs": {"type": "array", "items": {"type": "number"}, "maxItems": 3}},
        "required": ["name", "n", "ok", "kind", "xs"], "additionalProperties": False}
    c = compiler.start(ConstraintSpec("json_schema", json.dumps(schema)))
    text = random_walk(c, np.random.default_rng(seed))
    jsonschema.validate(json.loads(text), schema)


def test_json_object_is_any_object(compiler: ConstraintCompiler) -> None:
    for seed in range(3):
        c = compiler.start(ConstraintSpec("json_object"))
        assert isinstance(json.loads(random_walk(c, np.random.default_rng(seed))), dict)


def test_compiled_grammars_are_cached_lru(monkeypatch: pytest.MonkeyPatch) -> None:
    fresh = ConstraintCompiler(llguidance.LLTokenizer(llguidance.TokenizerWrapper(TOY)))
    built: list[str] = []
    real = constraint_module.grammar_of

    def counting(spec: ConstraintSpec) -> str:
        built.append(spec.source)
        return real(spec)

    monkeypatch.setattr(constraint_module, "CACHE_SIZE", 2)
    monkeypatch.setattr(constraint_module, "grammar_of", counting)
    for source in ["a", "b", "a", "c", "a", "b"]:
        fresh.start(ConstraintSpec("regex", source))
    assert built == ["a", "b", "c", "b"]  # "a" twice from the cache; "c" evicted "b"


def test_a_tokenizer_factory_runs_once() -> None:
    calls = []

    def make() -> llguidance.LLTokenizer:
        calls.append(1)
        return llguidance.LLTokenizer(llguidance.TokenizerWrapper(TOY))

    lazy = ConstraintCompiler(make)
    assert not calls
    lazy.start(ConstraintSpec("regex", "a"))
    lazy.start(ConstraintSpec("regex", "b"))
    assert calls == [1]


# ---- lazy constraints --------------------------------------------------------------------------

CALL_GRAMMAR = 'start: "<call>" %json{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"], "additionalProperties": false}'


def test_free_until_the_trigger_then_the_grammar(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>"))
    feed(c, tokens_of("I will call <ca"))
    assert c.allowed() is None and not c.done and not c.active
    feed(c, tokens_of("ll>"))  # the trigger arrived in three tokens, mid-token
    assert c.active
    assert np.flatnonzero(c.allowed()).tolist() == [ord("{"), OPEN]
    feed(c, tokens_of('{"x": 4}'))
    assert c.done


def test_a_trigger_named_while_thinking_does_not_start_the_grammar(
        compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>",
                                      armed_after="</think>"))
    feed(c, tokens_of("maybe <call> it? "))  # thinking: the marker is just text here
    assert not c.active and c.allowed() is None
    feed(c, tokens_of("</thi"))
    c.rollback(len(tokens_of("</thi")))  # a rejected draft of the end of thinking
    feed(c, tokens_of("</think>ok <call>"))
    assert c.active
    twin = c.fork()
    feed(twin, tokens_of('{"x": 4}'))
    assert twin.done and not c.done


def test_rolling_back_over_the_end_of_thinking_disarms_the_trigger(
        compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>",
                                      armed_after="</think>"))
    feed(c, tokens_of("a</think>"))
    c.rollback(len(tokens_of("</think>")))
    feed(c, tokens_of(" <call>"))
    assert not c.active


def test_a_trigger_on_a_token_boundary_is_fed_as_its_tokens(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>"))
    feed(c, [*tokens_of("ok "), CALL])
    assert c.active and c.allowed()[OPEN]


def test_text_after_the_trigger_in_the_same_token_is_checked(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>"))
    feed(c, tokens_of("<cal"))
    c.advance(256 + ToyTokenizer.MERGES.index(b'l>{"'))  # the trigger's end and the call's start
    assert c.active and c.allowed()[ord("x")]


def test_refused_text_after_the_trigger_is_a_constraint_error(compiler: ConstraintCompiler) -> None:
    """The token that completes the trigger carries "!", which the grammar refuses: an error,
    and the constraint stays as it was (free), as for any refused token."""
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>"))
    feed(c, tokens_of("say <cal"))
    bad = 256 + ToyTokenizer.MERGES.index(b"l>!")
    with pytest.raises(ConstraintError, match="after the trigger '<call>' does not match"):
        c.advance(bad)
    assert not c.active and not c.try_advance(bad)
    feed(c, tokens_of("l>"))
    assert c.active


def test_rollback_across_the_trigger(compiler: ConstraintCompiler) -> None:
    c = compiler.start(ConstraintSpec("lark", CALL_GRAMMAR, trigger="<call>"))
    feed(c, tokens_of("x <call"))
    feed(c, [ord(">"), OPEN, ord("x")])
    assert c.active
    c.rollback(3)  # back before the trigger fired
    assert not c.active and c.allowed() is None
    feed(c, tokens_of("ate"))  # "<callate": no trigger
    assert not c.active
    c.rollback(3)
    c.advance(ord(">"))
    assert c.active and c.allowed()[OPEN]


# ---- the sampler applies it ----------------------------------------------------------------------

def test_the_sampler_samples_only_what_the_grammar_allows(compiler: ConstraintCompiler) -> None:
    """Mask after penalties, before the transforms: p is the masked distribution, greedy
    the masked argmax, and a row of another width (a draft's vocabulary) fits."""
    logits = np.random.default_rng(0).standard_normal(len(TOY.tokens)).astype(np.float32)
    logits[ord("z")] = 50.0  # the unconstrained favourite, never allowed below
    c = compiler.start(ConstraintSpec("regex", "[0-9]+"))
    digits = np.arange(ord("0"), ord("9") + 1)
    warm = Sampler(SamplingParams(temperature=0.7, top_k=4, repeat_penalty=1.3), 0, c)
    p = warm.distribution(logits, [ord("5")])
    assert p.sum() == pytest.approx(1.0) and set(np.flatnonzero(p)) <= set(digits)
    assert np.count_nonzero(p) == 4  # top-k counted among the allowed tokens only
    assert all(warm.sample(logits, []) in digits for _ in range(20))
    greedy = Sampler(SamplingParams(temperature=0.0), 0, c)
    assert greedy.sample(logits, []) == int(digits[np.argmax(logits[digits])])
    wider = np.concatenate([logits, np.full(5, 99.0, np.float32)])  # ids the target lacks
    assert greedy.sample(wider, []) in digits
    best = greedy.sample(logits, [])
    value, top = greedy.logprobs(logits, [], best, 20)
    assert top[0] == (best, value)
    assert len(top) == 10 and sum(np.exp(v) for _, v in top) == pytest.approx(1.0)


def _accepts(compiler: ConstraintCompiler, spec: ConstraintSpec, text: str) -> bool:
    c = compiler.start(spec)
    return all(c.try_advance(t) for t in tokens_of(text))


def test_open_objects_are_closed_as_llama_cpp_closes_them(compiler: ConstraintCompiler) -> None:
    """`properties` without `additionalProperties`: declared keys only (every document still
    valid under the schema as sent); an explicit `true` and `allOf` schemas stay open."""
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    closed = ConstraintSpec("json_schema", json.dumps(schema))
    assert _accepts(compiler, closed, '{"a": 1}')
    assert not _accepts(compiler, closed, '{"a": 1, "b": 2}')
    opened = ConstraintSpec("json_schema", json.dumps({**schema, "additionalProperties": True}))
    assert _accepts(compiler, opened, '{"a": 1, "b": 2}')
    merged = ConstraintSpec("json_schema", json.dumps(
        {"allOf": [schema, {"properties": {"b": {"type": "integer"}}}]}))
    assert _accepts(compiler, merged, '{"a": 1, "b": 2}')
