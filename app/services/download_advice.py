"""What a failed download means and what to do about it, in words: shown by the Downloads
page beside the failed job, and by Settings → Model when a quant switch's download fails.

    >>> explain(DownloadJob("j1", "org/repo", "m.gguf", state="failed",
    ...                     error_kind="HubOffline", error="Offline"))
    'Offline — Offline mode is on (HF_HUB_OFFLINE). Turn it off to download.'
    >>> explain(DownloadJob("j2", "org/repo", "m.gguf", state="running"))
    ''
"""

from __future__ import annotations

from runtime.downloads.manager import DownloadJob

# error kind → what it means and what to do, in words.
ADVICE = {
    "GatedRepo": "The repository is gated. Accept its terms on huggingface.co, enter a token "
                 "of that account (Enter token…), then Retry.",
    "DiskFull": "The disk is full. Free some space, or choose another models folder in "
                "Settings, then Retry: the bytes already fetched are kept.",
    "HashMismatch": "The file arrived damaged (it does not match its published checksum); the "
                    "bad copy was set aside. Retry fetches it again.",
    "DownloadFailed": "The connection kept failing. Check the network (or the Hub mirror in "
                      "Settings) and Retry: it resumes where it stopped.",
    "HubUnreachable": "The Hub could not be reached. Check the network or the mirror in Settings, "
                      "then Retry.",
    "HubServerError": "The Hub is having trouble (a server error). Retry in a few minutes.",
    "HubOffline": "Offline mode is on (HF_HUB_OFFLINE). Turn it off to download.",
    "RemoteFileNotFound": "The file is no longer in the repository. Open the repository again "
                          "and pick another quant.",
    "RepoNotFound": "The repository was not found (renamed, deleted or private). Search for it "
                    "again, or enter a token that can see it.",
}


def explain(job: DownloadJob) -> str:
    """A failed job's message and what to do, as one paragraph."""
    if job.state != "failed":
        return ""
    advice = ADVICE.get(job.error_kind or "",
                        "Retry; if it fails again, the message above says why.")
    return f"{job.error or 'The download failed.'} — {advice}"
