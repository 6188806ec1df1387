"""Typed errors a person can cause, each with a one-line message that says what to do.

Every user-facing failure in `runtime` derives from `OutriderError`, so the CLI, the server
and the app can show `str(error)` as is, and code can still branch on the type. A name the
user (or a file's author) chose goes into a message through `shown`, so a newline or an ANSI
escape in a file name cannot break the one line or repaint the terminal.
"""


def shown(name: object) -> str:
    """`name` (a file, a path, a model) as a message may print it: characters that are not
    printable get the escapes `repr` uses; ordinary Unicode, spaces and quotes stay as they are.

    >>> shown("model.gguf"), shown("evil\\n.gguf"), shown("\\x1b[31mred"), shown("модель 1.gguf")
    ('model.gguf', 'evil\\\\n.gguf', '\\\\x1b[31mred', 'модель 1.gguf')

    Why not `{name!r}`: repr adds quotes, and messages choose their own quoting. Why at the
    name rather than only where a message is printed: the app shows runtime's messages too
    (the server and the CLI escape whole messages as well, as a last guard).
    """
    text = str(name)
    if text.isprintable():
        return text
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


class OutriderError(Exception):
    """Base of every error a user can cause. `str()` is a one-line human message."""


class ModelFileError(OutriderError):
    """A model file is missing, unreadable, or not what it claims to be."""


class ModelNotFound(ModelFileError):
    """The path names no file."""


class NotAGGUF(ModelFileError):
    """The file is not a GGUF model (wrong magic or version)."""


class TruncatedModel(ModelFileError):
    """The file ends before the data its header describes (an interrupted download)."""


class CorruptModel(ModelFileError):
    """The header contradicts itself: absurd counts, unknown types, misaligned offsets."""


class UnsupportedArchitecture(ModelFileError):
    """llama.cpp in this build does not know the model's architecture."""


class IncompleteSplit(ModelFileError):
    """A model split into several files (-00001-of-0000N) is missing parts."""


class LoadCrashed(ModelFileError):
    """llama.cpp aborted (GGML_ASSERT, SIGABRT) loading the file or running its first token,
    in the probe's child process; the verdict is remembered (runtime.gguf.verdicts)."""


class SettingsError(OutriderError):
    """A setting has an impossible value (context 0, negative layers, unknown key)."""


class ContextOverflow(OutriderError):
    """A prompt does not fit in the context window."""


class LoadError(OutriderError):
    """llama.cpp refused to load a model or to create its context."""


class NoModelLoaded(OutriderError):
    """A request needs a model and none is loaded."""


class ModelTooLarge(LoadError):
    """A model cannot be loaded beside the resident ones, not even alone: the message carries
    the plan ("needs 9.4 GiB, 6.1 GiB free"). The server answers 400."""


class DefaultModelError(OutriderError):
    """The default model could not be fetched or failed its checksum."""


# --- Hugging Face Hub, downloads (runtime.hub.client, runtime.downloads.manager) ---------------------------


class HubError(OutriderError):
    """Talking to the Hugging Face Hub (or the mirror named by HF_ENDPOINT) failed."""


class HubOffline(HubError):
    """Offline mode (HF_HUB_OFFLINE) is on and no cached answer exists."""


class HubUnreachable(HubError):
    """The Hub could not be reached (no network, DNS, refused connection, timeout)."""


class HubServerError(HubError):
    """The Hub answered with a server error (HTTP 5xx or 429): worth retrying later."""


class RepoNotFound(HubError):
    """The repository (or revision) does not exist, or is private and the token cannot see it."""


class RemoteFileNotFound(HubError):
    """The repository exists but has no such file (HTTP 404)."""


class GatedRepo(HubError):
    """The repository is gated: it needs a token of an account that accepted its terms."""

    needs_token = True


class DownloadError(OutriderError):
    """A download could not finish."""


class DiskFull(DownloadError):
    """Not enough free disk space for the download (checked before starting, and on ENOSPC)."""


class HashMismatch(DownloadError):
    """The downloaded bytes do not match the file's published sha256; the file was set aside."""


class OversizedDownload(DownloadError):
    """The server sent more bytes than the file's advertised size; the excess was not kept."""


class QueueNotSaved(DownloadError):
    """The download queue (downloads/queue.json) could not be written (a full disk): the queue
    goes on in memory and is written again at its next change."""


class DownloadFailed(DownloadError):
    """Retries ran out (connection errors, HTTP 5xx, stalls)."""


class DownloadRunningElsewhere(DownloadError):
    """Another Outrider process (the app or `outrider pull`) is downloading this file now, so
    this one may not pause, cancel or remove it."""


class PortInUse(OutriderError):
    """The server's port is taken by another process."""


class PathNotAllowed(OutriderError):
    """A request names a file outside the models library (the server refuses to touch it)."""


class EngineBusy(OutriderError):
    """The engine is loading or unloading a model and cannot take this request now."""


# --- Quantization and quality (runtime.quality.quantize, runtime.quality.imatrix, runtime.quality.evaluate) ---------


class QuantizeError(OutriderError):
    """A quantized copy of a model could not be made (bad recipe, llama.cpp refused)."""


class RequantizeRefused(QuantizeError):
    """The source is already quantized and the caller did not allow requantizing."""


class ImatrixError(QuantizeError):
    """An importance matrix file is unreadable, or does not fit the model or the quant type."""


class QuantizeCancelled(QuantizeError):
    """The quantization was cancelled; nothing was left behind."""


class EvalError(OutriderError):
    """A perplexity / KL-divergence evaluation could not run."""


class TextTooShort(EvalError):
    """The evaluation text has fewer than two context windows of tokens."""


class KLDBaseMismatch(EvalError):
    """A KL-divergence reference file was made from another text, context size or vocabulary."""


class ChatTemplateError(OutriderError):
    """The model's chat template refused the messages (its own raise_exception)."""


class ConstraintError(OutriderError):
    """A structured-output request the engine cannot honour: a malformed schema, a keyword the
    compiler does not support (the message names it and its path, e.g. "unsupported keyword
    'patternProperties' at /properties/tags"), a grammar that does not parse or cannot end.
    The server answers 400; the output is never silently unconstrained."""


class ToolsError(OutriderError):
    """A tools request the model cannot serve: the template's family has no known call
    format, a tool's parameters are not a valid JSON Schema, `tool_choice` names an unknown
    function. The server answers 400."""


class EmbeddingsUnsupported(OutriderError):
    """The loaded model cannot make embeddings: a reranker (its head scores pairs), or an
    encoder-decoder architecture (T5). The server answers 400."""


class ImageError(OutriderError):
    """An image a request or a chat attaches cannot be used: not an image, truncated, too
    large, animated, or the model has no projector to read it. The server answers 400."""


class DocumentError(OutriderError):
    """A document attached to a chat cannot be read as text: an encrypted or truncated PDF,
    one with no text layer, a file that is not UTF-8 text. The server answers 400."""


class GenerationUnsupported(OutriderError):
    """The model a request names cannot write text: an encoder-only model (a BERT embedder,
    a reranker). The server answers 400; an embedder still answers embeddings requests."""


class EngineError(OutriderError):
    """llama.cpp failed while evaluating a batch (not the request's fault)."""


class EngineCrashed(EngineError):
    """A model's engine process died (killed, out of memory, a llama.cpp abort): its in-flight
    requests end with this, and the next request for the model loads it again. 503."""


class WorkerError(SettingsError):
    """A worker named in the load settings cannot serve: unreachable, not an RPC server, an
    incompatible protocol version, named twice. Raised before anything is loaded. 400."""


class WorkerLost(EngineCrashed):
    """A worker holding part of the loaded model stopped answering mid-generation: llama.cpp's
    RPC client aborts its process, so the model is unloaded. `worker` names it ("host:port").
    503."""

    def __init__(self, message: str, worker: str = "") -> None:
        super().__init__(message)
        self.worker = worker


class InvalidLogits(EngineError):
    """The model's logits hold NaN or +inf (broken weights, a RoPE base of 0 or NaN): the
    request ends with "the model produced invalid numbers (NaN)"."""


class CatalogError(OutriderError):
    """The curated catalogue (models/catalog.toml) is malformed."""


class DesktopEntryError(OutriderError):
    """The Linux desktop entry could not be installed (wrong OS, missing packaging files)."""
