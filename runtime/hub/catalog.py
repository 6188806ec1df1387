"""The curated catalogue (`models/catalog.toml`): models per memory tier, target/draft pairs.

    >>> cat = load_catalog()
    >>> [m.id for m in cat.for_memory(8 << 30, role="chat")][:3]
    ['llama-3.1-8b-instruct', 'qwen2.5-7b-instruct', 'llama-3.2-3b-instruct']
    >>> [(p.target.id, p.draft.id) for p in cat.pairs][:1]
    [('qwen2.5-7b-instruct', 'qwen2.5-0.5b-instruct')]
    >>> cat.drafts_for("bartowski/Meta-Llama-3.1-8B-Instruct-GGUF")[0].repo
    'bartowski/Llama-3.2-1B-Instruct-GGUF'

What runs well on this machine (`Catalog.for_machine`) ranks the models that fit by an expected
decode speed: generating a token reads every weight once, so tok/s ≈ memory bandwidth / the
weights' bytes (`expected_tok_s`). Worked example, a 2-core machine without a GPU (2 × 6 GB/s):
Qwen2.5 14B at Q4_K_M is 14.7e9 × 4.85 / 8 ≈ 8.9 GB → 12 / 8.9 = 1.3 tok/s; Qwen2.5 1.5B (≈ 0.93 GB)
→ 13 tok/s, so it comes first.

The file is reviewed by hand (see its header); this module only reads and validates it,
refusing unknown keys by name so a typo is an error, not a silently missing field.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

from runtime.errors import CatalogError

Role = Literal["chat", "draft", "code"]
_ROLES = ("chat", "draft", "code")

# Bits per weight of the catalogue's default quants (llama.cpp's published averages).
_BITS = {"Q4_0": 4.5, "Q4_1": 5.0, "Q4_K_M": 4.85, "Q5_K_M": 5.7, "Q6_K": 6.6, "Q8_0": 8.5,
         "F16": 16.0}
# A rough, documented estimate of the bandwidth llama.cpp's decode reaches: per CPU core (a
# few cores saturate a desktop's memory, hence the cap) and for a GPU holding the model.
CPU_GBS_PER_CORE = 6.0
CPU_GBS_MAX = 60.0
GPU_GBS = 300.0
USABLE_TOK_S = 8.0  # below this a reply crawls: such models rank after those that run well


def machine_bandwidth_gbs(cores: int, gpu: bool) -> float:
    """The memory bandwidth decode is expected to reach here, GB/s (see the module doc)."""
    return GPU_GBS if gpu else min(CPU_GBS_MAX, CPU_GBS_PER_CORE * max(1, cores))


def expected_tok_s(model: CatalogModel, bandwidth_gbs: float) -> float:
    """Decode tokens per second ≈ bandwidth / bytes of weights (read once per token)."""
    weight_gb = model.params_b * _BITS.get(model.default_quant, 5.0) / 8
    return bandwidth_gbs / weight_gb if weight_gb > 0 else 0.0


@dataclass(frozen=True)
class CatalogModel:
    id: str
    name: str
    repo: str
    files: dict[str, str] = field(hash=False)  # quant → file name in the repo
    default_quant: str
    tier_gb: float
    params_b: float
    license: str
    role: Role
    source: str
    notes: str = ""

    @property
    def default_file(self) -> str:
        return self.files[self.default_quant]

    @property
    def pull_spec(self) -> str:
        """What `outrider pull` takes: `repo:QUANT`."""
        return f"{self.repo}:{self.default_quant}"


@dataclass(frozen=True)
class CatalogPair:
    target: CatalogModel
    draft: CatalogModel
    basis: str
    source: str


@dataclass(frozen=True)
class Catalog:
    models: tuple[CatalogModel, ...]
    pairs: tuple[CatalogPair, ...]
    reviewed: str

    def model(self, key: str) -> CatalogModel:
        """A model by id or repo id."""
        for m in self.models:
            if key in (m.id, m.repo):
                return m
        raise CatalogError(f"the catalogue has no model {key!r}")

    def for_memory(self, free_bytes: int, role: Role | None = None) -> list[CatalogModel]:
        """Models whose tier fits in `free_bytes`, largest tier first (the best that fits)."""
        gb = free_bytes / (1 << 30)
        fit = [m for m in self.models if m.tier_gb <= gb and (role is None or m.role == role)]
        return sorted(fit, key=lambda m: (-m.tier_gb, -m.params_b))

    def for_machine(self, free_bytes: int, *, cores: int, gpu: bool,
                    role: Role | None = None) -> list[tuple[CatalogModel, float]]:
        """(model, expected tok/s) of the models that fit in `free_bytes`, what runs well here
        first: those expected at `USABLE_TOK_S` or more, largest first; then the slower ones,
        fastest first. On 2 cores without a GPU, Qwen2.5 14B (1.3 tok/s) comes last."""
        bandwidth = machine_bandwidth_gbs(cores, gpu)
        rated = [(m, expected_tok_s(m, bandwidth)) for m in self.for_memory(free_bytes, role)]
        return sorted(rated, key=lambda mt: (mt[1] < USABLE_TOK_S,
                                             -mt[0].params_b if mt[1] >= USABLE_TOK_S else -mt[1]))

    def drafts_for(self, key: str) -> list[CatalogModel]:
        """Known-good drafts for a target given by id or repo id."""
        return [p.draft for p in self.pairs if key in (p.target.id, p.target.repo)]


def default_catalog_path() -> Path:
    """`models/catalog.toml` in a source checkout; `runtime/data/catalog.toml` when packaged."""
    runtime_dir = Path(__file__).resolve().parents[1]
    checkout = runtime_dir.parent / "models" / "catalog.toml"
    for candidate in (checkout, runtime_dir / "data" / "catalog.toml"):
        if candidate.is_file():
            return candidate
    return checkout


def load_catalog(path: Path | None = None) -> Catalog:
    path = path or default_catalog_path()
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise CatalogError(f"no catalogue at {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise CatalogError(f"{path.name} is not valid TOML: {exc}") from exc
    return parse_catalog(data)


def parse_catalog(data: dict[str, Any]) -> Catalog:
    _only(data, {"schema", "reviewed", "model", "pair"}, "the catalogue")
    if data.get("schema") != 1:
        raise CatalogError(f"catalogue schema {data.get('schema')!r} is not supported (1 is)")
    models: dict[str, CatalogModel] = {}
    for raw in data.get("model", []):
        m = _model(raw)
        if m.id in models:
            raise CatalogError(f"model id {m.id!r} appears twice")
        models[m.id] = m
    pairs = []
    for raw in data.get("pair", []):
        _only(raw, {"target", "draft", "basis", "source"}, "a pair")
        try:
            target, draft = models[raw["target"]], models[raw["draft"]]
        except KeyError as exc:
            raise CatalogError(f"pair names unknown model {exc.args[0]!r}") from None
        if draft.params_b >= target.params_b:
            raise CatalogError(f"pair {target.id} + {draft.id}: the draft must be the smaller model")
        pairs.append(CatalogPair(target, draft, str(raw.get("basis", "")), str(raw.get("source", ""))))
    return Catalog(tuple(models.values()), tuple(pairs), str(data.get("reviewed", "")))


def _model(raw: dict[str, Any]) -> CatalogModel:
    names = {f.name for f in fields(CatalogModel)}
    required = names - {"notes"}
    _only(raw, names, f"model {raw.get('id', '?')!r}")
    missing = sorted(required - set(raw))
    if missing:
        raise CatalogError(f"model {raw.get('id', '?')!r} lacks {', '.join(missing)}")
    if raw["role"] not in _ROLES:
        raise CatalogError(f"model {raw['id']!r}: role must be one of {', '.join(_ROLES)}")
    if raw["default_quant"] not in raw["files"]:
        raise CatalogError(f"model {raw['id']!r}: default_quant {raw['default_quant']} has no file")
    if raw["repo"].count("/") != 1:
        raise CatalogError(f"model {raw['id']!r}: repo must be owner/name, not {raw['repo']!r}")
    bad = [f for f in raw["files"].values() if not str(f).endswith(".gguf")]
    if bad:
        raise CatalogError(f"model {raw['id']!r}: not GGUF files: {', '.join(bad)}")
    return CatalogModel(**{**raw, "files": dict(raw["files"]), "tier_gb": float(raw["tier_gb"]),
                           "params_b": float(raw["params_b"])})


def _only(raw: dict[str, Any], allowed: set[str], what: str) -> None:
    unknown = sorted(set(raw) - allowed)
    if unknown:
        raise CatalogError(f"{what} has unknown key(s): {', '.join(unknown)}")
