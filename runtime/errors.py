"""Typed errors a person can cause, each with a one-line message that says what to do.

Every user-facing failure in `runtime` derives from `OutriderError`, so the CLI, the server
and the app can show `str(error)` as is, and code can still branch on the type.
"""


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


class SettingsError(OutriderError):
    """A setting has an impossible value (context 0, negative layers, unknown key)."""


class ContextOverflow(OutriderError):
    """A prompt does not fit in the context window."""


class LoadError(OutriderError):
    """llama.cpp refused to load a model or to create its context."""


class NoModelLoaded(OutriderError):
    """A request needs a model and none is loaded."""


class DefaultModelError(OutriderError):
    """The default model could not be fetched or failed its checksum."""
