"""`moeserve pull` against a hub that answers hostile values (issue 25 item 3): every header and
listing field that becomes a file name, a hash to check or a URL to follow."""
import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_hub import FakeHub, Repo  # noqa: E402
from test_pull import REPO_ID, cache_repo, env_for, make_files, pull, sha256  # noqa: E402,F401

LFS = "model-00001-of-00002.safetensors"
GIT = "config.json"


@pytest.fixture
def hub():
    h = FakeHub({REPO_ID: Repo(make_files())}, page_size=50)
    yield h
    h.close()


def files_under(root):
    return {p for p in Path(root).rglob("*")} if Path(root).exists() else set()


def assert_nothing_outside(tmp_path, before):
    # Everything pull created lies in the HF home (or --local-dir): nothing new next to it.
    after = {p for p in tmp_path.iterdir()}
    assert after - before <= {tmp_path / "hfhome", tmp_path / "ld"}, after - before


HOSTILE_ETAGS = ['"../../../../escaped"', '"../escaped"', '"/tmp/abs"', '"abc"', '"' + "g" * 40 + '"',
                 '"' + "A" * 64 + '"', '"' + "a" * 63 + '"', '"a/b"', '""', '"' + "0" * 40 + '/x"']


@pytest.mark.parametrize("etag", HOSTILE_ETAGS)
@pytest.mark.parametrize("header,target", [("X-Linked-Etag", LFS), ("ETag", GIT)])
def test_hostile_etag_is_refused(hub, tmp_path, etag, header, target):
    before = set(tmp_path.iterdir())
    hub.faults = {"headers": {"/" + target: {header: etag}}}
    r = pull(hub, tmp_path, "--include", target)
    assert r.returncode != 0
    assert "not a 40- or 64-character lower-case hex digest" in r.stderr or "no ETag" in r.stderr, r.stderr
    assert_nothing_outside(tmp_path, before)
    root = cache_repo(tmp_path)
    assert not (root / "snapshots" / hub.repos[REPO_ID].commit / target).exists()
    blobs = [p for p in (root / "blobs").glob("*")] if (root / "blobs").exists() else []
    assert blobs == []


@pytest.mark.parametrize("commit", ["../../x", "z" * 40, "abc", "a" * 41])
def test_hostile_repo_commit_header(hub, tmp_path, commit):
    hub.faults = {"headers": {"/resolve/": {"X-Repo-Commit": commit}}}
    r = pull(hub, tmp_path, "--include", GIT)
    assert r.returncode != 0 and "X-Repo-Commit" in r.stderr, r.stderr


@pytest.mark.parametrize("size", ["-5", "12abc", "99999999999999999999999"])
def test_hostile_linked_size(hub, tmp_path, size):
    hub.faults = {"headers": {"/" + LFS: {"X-Linked-Size": size}}}
    r = pull(hub, tmp_path, "--include", LFS)
    assert r.returncode != 0 and "size" in r.stderr, r.stderr


@pytest.mark.parametrize("location", ["file:///etc/passwd", "ftp://127.0.0.1/x", "gopher://127.0.0.1:1/x"])
def test_redirect_to_other_schemes_is_refused(hub, tmp_path, location):
    hub.faults = {"headers": {"/" + LFS: {"Location": location}}}
    r = pull(hub, tmp_path, "--include", LFS)
    assert r.returncode != 0 and "only http and https redirects" in r.stderr, r.stderr


@pytest.mark.parametrize("sha", ["../../../escaped", "main", "g" * 40, ""])
def test_hostile_revision_sha(hub, tmp_path, sha):
    before = set(tmp_path.iterdir())
    hub.faults = {"revision_sha": sha}
    r = pull(hub, tmp_path, "--include", GIT)
    assert r.returncode != 0 and "commit" in r.stderr, r.stderr
    assert_nothing_outside(tmp_path, before)


@pytest.mark.parametrize("field,value", [
    ("path", 17), ("path", None), ("path", ["a"]), ("path", "../../escaped"), ("path", "/etc/x"),
    ("oid", "../../x"), ("oid", 5), ("size", -1), ("size", "big"),
    ("lfs", "x"), ("lfs", {"oid": "../../x", "size": 5}), ("lfs", {"oid": "a" * 64, "size": -3}),
])
def test_hostile_listing_fields(hub, tmp_path, field, value):
    before = set(tmp_path.iterdir())
    if value is None:
        hub.faults = {"listing": {LFS: {field: None}}}
    else:
        hub.faults = {"listing": {LFS: {field: value}}}
    r = pull(hub, tmp_path)
    assert r.returncode != 0, r.stderr
    assert "listing" in r.stderr or "unsafe file path" in r.stderr, r.stderr
    assert_nothing_outside(tmp_path, before)


@pytest.mark.parametrize("field,value", [("rfilename", 3), ("rfilename", "../x"), ("blobId", "zz"),
                                         ("lfs", {"sha256": "../../x"})])
def test_hostile_siblings_fields(hub, tmp_path, field, value):
    hub.faults = {"no_tree": True, "listing": {LFS: {field: value}}}
    r = pull(hub, tmp_path)
    assert r.returncode != 0
    assert "listing" in r.stderr or "unsafe file path" in r.stderr, r.stderr


def test_deeply_nested_listing_is_refused_not_crashed(hub, tmp_path):
    hub.faults = {"listing": {LFS: {"size": [[[[[]]]]]}}}
    r = pull(hub, tmp_path)
    assert r.returncode != 0 and r.returncode > 0, r.stderr  # an error, not a signal


def test_git_file_whose_bytes_differ_from_its_etag_is_an_error(hub, tmp_path):
    hub.faults = {"corrupt": ["/" + GIT]}
    r = pull(hub, tmp_path, "--include", GIT)
    assert r.returncode != 0 and "git blob sha1 mismatch" in r.stderr, r.stderr
    root = cache_repo(tmp_path)
    assert not (root / "snapshots" / hub.repos[REPO_ID].commit / GIT).exists()
    assert [p for p in (root / "blobs").glob("*")] == []
    out = tmp_path / "ld"
    r = pull(hub, tmp_path, "--include", GIT, "--local-dir", str(out))
    assert r.returncode != 0 and not (out / GIT).exists()


def test_symlinked_folder_in_local_dir_does_not_lead_out(hub, tmp_path):
    out = tmp_path / "ld"
    (out / "sub").parent.mkdir(parents=True)
    outside = tmp_path / "outside"
    outside.mkdir()
    os.symlink(outside, out / "sub")  # sub/ -> a folder outside the target
    r = pull(hub, tmp_path, "--include", "sub/*", "--local-dir", str(out))
    assert r.returncode != 0 and "outside" in r.stderr, r.stderr
    assert list(outside.rglob("*")) == []


def test_unsafe_revision_name(hub, tmp_path):
    r = pull(hub, tmp_path, "--revision", "../../../x")
    assert r.returncode != 0 and "unsafe revision" in r.stderr, r.stderr
