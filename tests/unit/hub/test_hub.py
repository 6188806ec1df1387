"""runtime.hub.client, and the fake hub itself, driven by the real huggingface_hub client."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

import pytest
from huggingface_hub import HfApi, hf_hub_download

from runtime.errors import GatedRepo, HubOffline, HubUnreachable, RemoteFileNotFound, RepoNotFound
from runtime.hub.client import Hub, hub_endpoint, offline_mode, redact
from tests.hubserver import GATED_REPO, GATED_TOKEN, TINY_DRAFT_REPO, TINY_REPO, FakeHub
from tests.hubserver.fixtures import fake_hub  # noqa: F401  (a fixture)

# -- the fake hub speaks the Hub's protocol (the real client against it) ----------------------


def test_real_client_lists_models(fake_hub: FakeHub) -> None:  # noqa: F811
    api = HfApi(endpoint=fake_hub.url)
    ids = [m.id for m in api.list_models(filter="gguf", search="tiny", sort="likes")]
    assert ids == [TINY_DRAFT_REPO, TINY_REPO, GATED_REPO]


def test_real_client_reads_model_info_with_file_metadata(fake_hub: FakeHub) -> None:  # noqa: F811
    info = HfApi(endpoint=fake_hub.url).model_info(TINY_REPO, files_metadata=True)
    assert info.sha == fake_hub.repo(TINY_REPO).head
    sizes = {s.rfilename: (s.size, s.lfs.sha256 if s.lfs else None) for s in info.siblings or ()}
    blob = fake_hub.repo(TINY_REPO).files("main")["tiny-F32.gguf"]  # type: ignore[index]
    assert sizes["tiny-F32.gguf"] == (blob.size, blob.sha256)


def test_real_client_downloads_through_the_cdn_redirect(fake_hub: FakeHub, tmp_path: Path) -> None:  # noqa: F811
    path = hf_hub_download(TINY_REPO, "tiny-F32.gguf", endpoint=fake_hub.url,
                           cache_dir=tmp_path / "hf")
    blob = fake_hub.repo(TINY_REPO).files("main")["tiny-F32.gguf"]  # type: ignore[index]
    assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == blob.sha256
    stats = fake_hub.stats(TINY_REPO, "tiny-F32.gguf")
    assert (stats.heads, stats.gets, stats.bytes_sent) == (1, 1, blob.size)


def test_fake_hub_serves_ranges_like_the_hub(fake_hub: FakeHub) -> None:  # noqa: F811
    import httpx

    blob = fake_hub.repo(TINY_REPO).files("main")["tiny-F32.gguf"]  # type: ignore[index]
    url = f"{fake_hub.url}/{TINY_REPO}/resolve/main/tiny-F32.gguf"
    r = httpx.get(url, headers={"Range": "bytes=10-19"}, follow_redirects=True)
    assert r.status_code == 206
    assert r.headers["Content-Range"] == f"bytes 10-19/{blob.size}"
    assert r.content == blob.read(10, 20)
    head = httpx.head(url)
    assert head.status_code == 302
    assert head.headers["X-Linked-Size"] == str(blob.size)
    assert head.headers["X-Linked-Etag"] == f'"{blob.sha256}"'
    assert head.headers["X-Repo-Commit"] == fake_hub.repo(TINY_REPO).head


# -- runtime.hub.client ------------------------------------------------------------------------------


def test_search_sorts_and_filters(fake_hub: FakeHub) -> None:  # noqa: F811
    hub = Hub()
    assert [h.repo_id for h in hub.search("tiny", sort="downloads")] == [
        TINY_REPO, TINY_DRAFT_REPO, GATED_REPO]
    assert [h.repo_id for h in hub.search("", sort="likes", limit=1)] == [TINY_DRAFT_REPO]
    assert [h.repo_id for h in hub.search("", author="gated")] == [GATED_REPO]
    hit = hub.search("Tiny-GGUF")[0]
    assert (hit.repo_id, hit.downloads, hit.likes, hit.gated) == (TINY_REPO, 500, 7, False)
    assert hit.last_modified is not None and hit.last_modified.year == 2024


def test_recent_sort_follows_last_modified(fake_hub: FakeHub) -> None:  # noqa: F811
    fake_hub.update_file(TINY_DRAFT_REPO, "tiny-draft-F32.gguf", b"GGUF new bytes")
    assert Hub().search("", sort="recent")[0].repo_id == TINY_DRAFT_REPO


def test_repo_details(fake_hub: FakeHub) -> None:  # noqa: F811
    details = Hub().repo_details(TINY_REPO)
    assert details.revision == fake_hub.repo(TINY_REPO).head
    assert details.license == "apache-2.0" and details.gated is False
    assert [f.name for f in details.gguf_files] == [
        "tiny-F32.gguf", "tiny-Q4_K_M.gguf",
        "tiny-Q8_0-00001-of-00002.gguf", "tiny-Q8_0-00002-of-00002.gguf"]
    blob = fake_hub.repo(TINY_REPO).files("main")["tiny-Q4_K_M.gguf"]  # type: ignore[index]
    f = details.file("tiny-Q4_K_M.gguf")
    assert (f.size, f.sha256) == (blob.size, blob.sha256)
    gated = Hub().repo_details(GATED_REPO)
    assert gated.gated is True and gated.license == "llama3.1"


def test_repo_details_at_an_older_revision(fake_hub: FakeHub) -> None:  # noqa: F811
    old = fake_hub.repo(TINY_REPO).head
    new = fake_hub.update_file(TINY_REPO, "tiny-F32.gguf", b"GGUF changed")
    assert Hub().repo_details(TINY_REPO).revision == new
    at_old = Hub().repo_details(TINY_REPO, revision=old)
    assert at_old.revision == old
    assert at_old.file("tiny-F32.gguf").size != len(b"GGUF changed")


def test_hf_endpoint_is_read_at_call_time(fake_hub: FakeHub, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    hub = Hub()
    assert hub.endpoint == fake_hub.url
    with FakeHub() as other:
        other.add_repo("other/Only-Here-GGUF", {"x.gguf": b"GGUF"})
        monkeypatch.setenv("HF_ENDPOINT", other.url + "/")
        assert hub_endpoint() == other.url
        assert [h.repo_id for h in hub.search("")] == ["other/Only-Here-GGUF"]
        assert hub.file_url("a/b", "c.gguf") == f"{other.url}/a/b/resolve/main/c.gguf"


def test_file_metadata_names_the_bytes(fake_hub: FakeHub) -> None:  # noqa: F811
    meta = Hub().file_metadata(TINY_REPO, "tiny-F32.gguf")
    blob = fake_hub.repo(TINY_REPO).files("main")["tiny-F32.gguf"]  # type: ignore[index]
    assert (meta.etag, meta.sha256, meta.size) == (blob.sha256, blob.sha256, blob.size)
    assert meta.commit == fake_hub.repo(TINY_REPO).head
    assert meta.location.startswith(fake_hub.cdn_url)


def test_typed_errors(fake_hub: FakeHub) -> None:  # noqa: F811
    hub = Hub()
    with pytest.raises(RepoNotFound):
        hub.repo_details("nobody/Nothing-GGUF")
    with pytest.raises(RemoteFileNotFound):
        hub.file_metadata(TINY_REPO, "missing.gguf")
    with pytest.raises(RemoteFileNotFound):
        hub.repo_details(TINY_REPO).file("missing.gguf")
    with pytest.raises(GatedRepo) as gated:
        hub.file_metadata(GATED_REPO, "tiny-gated-F32.gguf")
    assert gated.value.needs_token and "token" in str(gated.value)


def test_gated_repo_works_with_a_token_that_never_shows(fake_hub: FakeHub) -> None:  # noqa: F811
    hub = Hub(token=GATED_TOKEN)
    meta = hub.file_metadata(GATED_REPO, "tiny-gated-F32.gguf")
    assert meta.size is not None
    assert GATED_TOKEN not in repr(hub)
    assert redact(f"Bearer {GATED_TOKEN} refused", GATED_TOKEN) == "Bearer hf_*** refused"
    with pytest.raises(GatedRepo) as wrong:
        Hub(token="hf_wrong_token_000").file_metadata(GATED_REPO, "tiny-gated-F32.gguf")
    assert "hf_wrong_token_000" not in str(wrong.value)


def test_unreachable_hub_is_a_typed_error(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    with pytest.raises(HubUnreachable):
        Hub(timeout=2).repo_details(TINY_REPO)
    with pytest.raises(HubUnreachable):
        Hub(timeout=2).file_metadata(TINY_REPO, "tiny-F32.gguf")
    # (search goes through huggingface_hub's paginate, which retries for ~20 s first)


def test_offline_mode_serves_cached_answers_or_says_offline(
        fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    hub = Hub(cache_dir=tmp_path)
    online_hits = hub.search("tiny")
    online_details = hub.repo_details(TINY_REPO)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert offline_mode()
    fake_hub.stop()  # offline means no request at all: nothing answers any more
    assert hub.search("tiny") == online_hits
    assert hub.repo_details(TINY_REPO) == online_details
    with pytest.raises(HubOffline):
        hub.search("never searched")
    with pytest.raises(HubOffline):
        hub.repo_details(TINY_DRAFT_REPO)
    with pytest.raises(HubOffline):
        hub.file_metadata(TINY_REPO, "tiny-F32.gguf")
