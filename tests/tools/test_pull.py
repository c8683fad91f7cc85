"""End-to-end tests of `moeserve pull` against the stand-in hub (fake_hub.py) on loopback."""
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fake_hub import FakeHub, Repo  # noqa: E402

BIN = os.environ.get("MOESERVE_BIN", str(Path(__file__).resolve().parents[2] / "build" / "moeserve"))
REPO_ID = "acme/tiny-moe"
TOKEN = "hf_testtoken123"


def make_files(seed=7):
    rng = random.Random(seed)
    blob = lambda n: bytes(rng.getrandbits(8) for _ in range(n))  # noqa: E731
    return {
        "config.json": b'{"model_type": "minimax_m2", "hidden_size": 64}\n',
        "README.md": b"# tiny\n",
        "tokenizer.json": blob(3000),  # LFS by size
        "model-00001-of-00002.safetensors": blob(700_000),
        "model-00002-of-00002.safetensors": blob(1_300_000),
        "sub/dir/extra.bin": blob(40_000),
        "sub/notes.txt": b"nested small file\n",
        "sub/with space+plus.txt": b"quoted path\n",
        "empty.txt": b"",
        "dup/a.safetensors": b"same" * 2000,  # two paths, one blob
        "dup/b.safetensors": b"same" * 2000,
    }


@pytest.fixture
def hub(request):
    file_host = getattr(request, "param", "127.0.0.1")
    h = FakeHub({REPO_ID: Repo(make_files()),
                 "acme/gated": Repo({"config.json": b"{}\n", "w.safetensors": b"x" * 5000}, gated=True),
                 "acme/private": Repo({"config.json": b"{}\n"}, private=True)},
                tokens=[TOKEN], page_size=3, file_host=file_host)
    yield h
    h.close()


def env_for(hub, tmp_path, **extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env.update({"HF_ENDPOINT": hub.endpoint, "HF_HOME": str(tmp_path / "hfhome"), "HF_HUB_DOWNLOAD_TIMEOUT": "3"})
    env.update(extra)
    return env


def pull(hub, tmp_path, *args, env=None, timeout=120, **envx):
    args = list(args)
    repo = args.pop(0) if args and not args[0].startswith("-") else REPO_ID
    cmd = [BIN, "pull", repo, "--log-interval", "0.5"] + args
    return subprocess.run(cmd, env=env or env_for(hub, tmp_path, **envx), capture_output=True, text=True,
                          timeout=timeout)


def cache_repo(tmp_path):
    return tmp_path / "hfhome" / "hub" / "models--acme--tiny-moe"


def sha256(b):
    return hashlib.sha256(b).hexdigest()


def check_cache(tmp_path, hub, files=None):
    repo = hub.repos[REPO_ID]
    files = files if files is not None else list(repo.files)
    root = cache_repo(tmp_path)
    assert (root / "refs" / "main").read_text() == repo.commit  # no newline, as huggingface_hub writes it
    snap = root / "snapshots" / repo.commit
    for p in files:
        link = snap / p
        assert link.is_symlink(), p
        target = os.readlink(link)
        e = repo.entry(p)
        etag = e["lfs"]["oid"] if "lfs" in e else e["oid"]
        assert target == "../" * (p.count("/") + 2) + "blobs/" + etag
        assert link.read_bytes() == repo.files[p]
        assert (root / "blobs" / etag).is_file() and not (root / "blobs" / etag).is_symlink()
    assert not list(root.glob("blobs/*.incomplete*"))
    return snap


def test_cache_layout_and_listing_pagination(hub, tmp_path):
    r = pull(hub, tmp_path)
    assert r.returncode == 0, r.stderr
    snap = check_cache(tmp_path, hub)
    assert r.stdout.strip().splitlines()[-1] == str(snap)
    assert "Fetched 10 files" in r.stderr and "1 already present" in r.stderr
    # the listing was paginated through Link headers
    trees = [q for q in hub.requests("hub", "GET") if "/tree/" in q["path"]]
    assert len(trees) >= 3 and any("cursor=" in q["path"] for q in trees)
    # LFS files came from the file host, small git files straight from the hub
    got = [q["path"].split("/lfs/")[1].split("?")[0] for q in hub.requests("file", "GET")]
    repo = hub.repos[REPO_ID]
    assert sorted(got) == sorted({sha256(repo.files[p]) for p in repo.lfs})  # the shared blob once


def test_huggingface_hub_reads_our_cache(hub, tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    r = pull(hub, tmp_path)
    assert r.returncode == 0, r.stderr
    cache = tmp_path / "hfhome" / "hub"
    repo = hub.repos[REPO_ID]
    info = hf.scan_cache_dir(cache)
    assert not info.warnings, info.warnings
    (cr,) = [x for x in info.repos if x.repo_id == REPO_ID]
    (rev,) = list(cr.revisions)
    assert rev.commit_hash == repo.commit and "main" in rev.refs
    assert {f.file_name for f in rev.files} == {p.rsplit("/", 1)[-1] for p in repo.files}
    for p in repo.files:
        path = hf.try_to_load_from_cache(REPO_ID, p, cache_dir=cache, revision="main")
        assert isinstance(path, str) and Path(path).read_bytes() == repo.files[p]
    # huggingface_hub itself, offline, resolves the snapshot from our refs/ + snapshots/
    snap = hf.snapshot_download(REPO_ID, cache_dir=cache, local_files_only=True)
    assert Path(snap).name == repo.commit


@pytest.mark.parametrize("hub", ["localhost"], indirect=True)
def test_huggingface_hub_agrees_with_the_fake_hub(hub, tmp_path):
    """The stand-in speaks the protocol huggingface_hub expects: hf_hub downloads from it, then
    finds everything our pull left in place (no new file-host GET)."""
    hf = pytest.importorskip("huggingface_hub")
    ours = pull(hub, tmp_path)
    assert ours.returncode == 0, ours.stderr
    n = len(hub.requests("file", "GET"))
    snap = hf.snapshot_download(REPO_ID, cache_dir=tmp_path / "hfhome" / "hub", endpoint=hub.endpoint)
    assert Path(snap).name == hub.repos[REPO_ID].commit
    assert len(hub.requests("file", "GET")) == n
    other = tmp_path / "hf_own"
    hf.snapshot_download(REPO_ID, cache_dir=other, endpoint=hub.endpoint)
    def tree(root):  # trees/ is huggingface_hub's optional listing cache (v1.22+)
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if not str(p.relative_to(root)).startswith("trees"))
    assert tree(cache_repo(tmp_path)) == tree(other / "models--acme--tiny-moe")
    for p in hub.repos[REPO_ID].files:
        assert os.readlink(cache_repo(tmp_path) / "snapshots" / Path(snap).name / p) == \
            os.readlink(other / "models--acme--tiny-moe" / "snapshots" / Path(snap).name / p)


def test_local_dir_real_files_and_metadata(hub, tmp_path):
    out = tmp_path / "model"
    r = pull(hub, tmp_path, "--local-dir", str(out))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == str(out)
    repo = hub.repos[REPO_ID]
    for p, data in repo.files.items():
        f = out / p
        assert f.is_file() and not f.is_symlink() and f.read_bytes() == data
        md = (out / ".cache/huggingface/download" / (p + ".metadata")).read_text().splitlines()
        e = repo.entry(p)
        assert md[0] == repo.commit and md[1] == (e["lfs"]["oid"] if "lfs" in e else e["oid"])
        float(md[2])
    assert not list(out.rglob("*.incomplete*"))
    assert (out / ".cache/huggingface/.gitignore").read_text() == "*"
    assert not (tmp_path / "hfhome" / "hub").exists()
    hf = pytest.importorskip("huggingface_hub")
    from huggingface_hub._local_folder import read_download_metadata
    for p in repo.files:
        m = read_download_metadata(out, p)
        assert m is not None and m.commit_hash == repo.commit


def test_include_exclude(hub, tmp_path):
    r = pull(hub, tmp_path, "--include", "*.json", "sub/", "--exclude", "*.bin")
    assert r.returncode == 0, r.stderr
    snap = cache_repo(tmp_path) / "snapshots" / hub.repos[REPO_ID].commit
    got = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir())
    assert got == ["config.json", "sub/notes.txt", "sub/with space+plus.txt", "tokenizer.json"]


def test_repo_after_glob_lists(hub, tmp_path):
    env = env_for(hub, tmp_path)
    r = subprocess.run([BIN, "pull", "--exclude", "*.bin", "--include", "*.json", "sub/", REPO_ID],
                       env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    snap = Path(r.stdout.strip())
    got = sorted(str(p.relative_to(snap)) for p in snap.rglob("*") if not p.is_dir())
    assert got == ["config.json", "sub/notes.txt", "sub/with space+plus.txt", "tokenizer.json"]
    r = subprocess.run([BIN, "pull", "--include", "*.json"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "repository id" in r.stderr


def test_idempotent_rerun_downloads_nothing(hub, tmp_path):
    assert pull(hub, tmp_path).returncode == 0
    n_file, n_head = len(hub.requests("file")), len(hub.requests("hub", "HEAD"))
    r = pull(hub, tmp_path)
    assert r.returncode == 0, r.stderr
    assert "Fetched 0 files" in r.stderr and "11 already present" in r.stderr
    assert len(hub.requests("file")) == n_file and len(hub.requests("hub", "HEAD")) == n_head
    out = tmp_path / "ld"
    assert pull(hub, tmp_path, "--local-dir", str(out)).returncode == 0
    n_file = len(hub.requests("file"))
    r = pull(hub, tmp_path, "--local-dir", str(out))
    assert r.returncode == 0 and "11 already present" in r.stderr, r.stderr
    assert len(hub.requests("file")) == n_file


def test_rerun_repairs_a_damaged_file(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    out = tmp_path / "ld"
    assert pull(hub, tmp_path, "--local-dir", str(out)).returncode == 0
    name = "model-00002-of-00002.safetensors"
    data = bytearray((out / name).read_bytes())
    data[1000] ^= 1  # same size, other bytes
    (out / name).write_bytes(bytes(data))
    r = pull(hub, tmp_path, "--local-dir", str(out))
    assert r.returncode == 0, r.stderr
    assert "Fetched 1 file " in r.stderr
    assert (out / name).read_bytes() == repo.files[name]
    # a git-stored file edited in place (same size) is found by its git blob sha1
    (out / "README.md").write_bytes(b"# TINY\n")
    r = pull(hub, tmp_path, "--local-dir", str(out))
    assert r.returncode == 0 and "Fetched 1 file " in r.stderr, r.stderr
    assert (out / "README.md").read_bytes() == repo.files["README.md"]
    # cache mode: a corrupt blob is found by its sha256 and fetched again
    assert pull(hub, tmp_path).returncode == 0
    blob = cache_repo(tmp_path) / "blobs" / sha256(repo.files[name])
    blob.write_bytes(b"garbage")
    small = cache_repo(tmp_path) / "blobs" / repo.entry("config.json")["oid"]
    small.write_bytes(small.read_bytes().upper())
    r = pull(hub, tmp_path)
    assert r.returncode == 0 and "Fetched 2 files " in r.stderr, r.stderr
    assert blob.read_bytes() == repo.files[name]
    assert small.read_bytes() == repo.files["config.json"]


def test_resume_after_kill(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    name = "model-00002-of-00002.safetensors"
    sha = sha256(repo.files[name])
    hub.faults = {"slow": 200_000}
    p = subprocess.Popen([BIN, "pull", REPO_ID, "--include", name, "--max-workers", "1", "--chunk-size", "0"],
                         env=env_for(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    part = cache_repo(tmp_path) / "blobs" / (sha + ".incomplete")
    deadline = time.time() + 30
    while time.time() < deadline and not (part.exists() and part.stat().st_size > 300_000):
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    have = part.stat().st_size
    assert 0 < have < len(repo.files[name])
    assert not (cache_repo(tmp_path) / "blobs" / sha).exists()
    assert not (cache_repo(tmp_path) / "snapshots" / repo.commit / name).exists()
    hub.faults = {}
    n = len(hub.requests("file", "GET"))
    r = pull(hub, tmp_path, "--include", name)
    assert r.returncode == 0, r.stderr
    ranges = [q["range"] for q in hub.requests("file", "GET")[n:]]
    assert ranges and ranges[0].startswith("bytes=") and int(ranges[0][6:].split("-")[0]) >= have - 65536
    assert int(ranges[0][6:].split("-")[0]) > 0
    check_cache(tmp_path, hub, [name])


def test_resume_after_kill_chunked(hub, tmp_path):
    """Parallel ranges: the sidecar keeps per-range progress across a kill."""
    repo = hub.repos[REPO_ID]
    name = "model-00002-of-00002.safetensors"
    sha = sha256(repo.files[name])
    hub.faults = {"slow": 60_000}
    p = subprocess.Popen([BIN, "pull", REPO_ID, "--include", name, "--max-workers", "4", "--chunk-size", "256K"],
                         env=env_for(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    side = cache_repo(tmp_path) / "blobs" / (sha + ".incomplete.json")
    import json
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            if sum(c[2] for c in json.loads(side.read_text())["chunks"]) > 0:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert hub.max_active >= 2  # ranges of one file in parallel
    chunks = json.loads(side.read_text())["chunks"]
    assert len(chunks) == 5 and sum(c[2] for c in chunks) > 0
    hub.faults = {}
    n = len(hub.requests("file", "GET"))
    r = pull(hub, tmp_path, "--include", name, "--chunk-size", "256K")
    assert r.returncode == 0, r.stderr
    later = hub.requests("file", "GET")[n:]
    starts = sorted(int(q["range"][6:].split("-")[0]) for q in later)
    assert len(later) <= 5 and any(s % 262144 != 0 for s in starts)  # resumed inside a range
    check_cache(tmp_path, hub, [name])


def test_wrong_checksum_fails_and_nothing_final(hub, tmp_path):
    name = "model-00001-of-00002.safetensors"
    sha = sha256(hub.repos[REPO_ID].files[name])
    hub.faults = {"corrupt": [sha]}
    r = pull(hub, tmp_path, "--include", name)
    assert r.returncode != 0
    assert "sha256 checksum mismatch" in r.stderr and name in r.stderr
    root = cache_repo(tmp_path)
    assert not (root / "blobs" / sha).exists()
    assert not (root / "snapshots" / hub.repos[REPO_ID].commit / name).exists()
    assert not list(root.glob("blobs/*.incomplete"))
    out = tmp_path / "ld"
    r = pull(hub, tmp_path, "--include", name, "--local-dir", str(out))
    assert r.returncode != 0 and not (out / name).exists()


def test_server_errors_are_retried(hub, tmp_path):
    hub.faults = {"fail": {"/revision/": 2, "/tree/": 2, "/resolve/": 3, "/lfs/": 3}}
    r = pull(hub, tmp_path)
    assert r.returncode == 0, r.stderr
    check_cache(tmp_path, hub)
    assert "HTTP 500" in r.stderr


def test_dropped_connection_is_resumed(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    big = "model-00002-of-00002.safetensors"
    hub.faults = {"drop": {sha256(repo.files[big]): 500_000}, "drop_times": 2}
    r = pull(hub, tmp_path, "--chunk-size", "0")
    assert r.returncode == 0, r.stderr
    check_cache(tmp_path, hub)
    gets = [q for q in hub.requests("file", "GET") if sha256(repo.files[big]) in q["path"]]
    assert len(gets) == 3 and gets[1]["range"] == "bytes=500000-"


def test_stalled_transfer_times_out_and_resumes(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    big = "model-00002-of-00002.safetensors"
    sha = sha256(repo.files[big])
    hub.faults = {"stall": {sha: 300_000}, "stall_s": 20}
    t0 = time.time()
    r = pull(hub, tmp_path, "--include", big, env=env_for(hub, tmp_path, HF_HUB_DOWNLOAD_TIMEOUT="2"))
    assert r.returncode == 0, r.stderr
    assert time.time() - t0 < 15
    gets = [q for q in hub.requests("file", "GET") if sha in q["path"]]
    assert len(gets) == 2 and gets[1]["range"] == "bytes=300000-"
    check_cache(tmp_path, hub, [big])


def test_server_ignoring_range(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    big = "model-00002-of-00002.safetensors"
    hub.faults = {"drop": {sha256(repo.files[big]): 400_000}, "ignore_range": True}
    r = pull(hub, tmp_path, "--include", big, "--chunk-size", "128K")
    assert r.returncode == 0, r.stderr
    check_cache(tmp_path, hub, [big])


def test_slow_file_host(hub, tmp_path):
    hub.faults = {"slow": 400_000}
    r = pull(hub, tmp_path, "--include", "*.safetensors", "--max-workers", "4")
    assert r.returncode == 0, r.stderr
    check_cache(tmp_path, hub, [p for p in hub.repos[REPO_ID].files if p.endswith(".safetensors")])
    assert hub.max_active >= 2  # files in parallel
    assert "pull: " in r.stderr  # periodic plain progress lines when not on a terminal


def test_auth_sent_to_hub_not_to_file_host(hub, tmp_path):
    r = pull(hub, tmp_path, env=env_for(hub, tmp_path, HF_TOKEN=TOKEN))
    assert r.returncode == 0, r.stderr
    hub_reqs = hub.requests("hub")
    assert hub_reqs and all(q["auth"] == "Bearer " + TOKEN for q in hub_reqs)
    files = hub.requests("file")
    assert files and all(q["auth"] is None for q in files)


def test_token_from_file_and_flag(hub, tmp_path):
    home = tmp_path / "hfhome"
    home.mkdir()
    (home / "token").write_text(TOKEN + "\n")
    r = pull(hub, tmp_path, "acme/gated")
    assert r.returncode == 0, r.stderr
    assert all(q["auth"] == "Bearer " + TOKEN for q in hub.requests("hub"))
    (home / "token").unlink()
    r = pull(hub, tmp_path, "acme/private", "--token", TOKEN)
    assert r.returncode == 0, r.stderr


def test_gated_without_token(hub, tmp_path):
    r = pull(hub, tmp_path, "acme/gated")
    assert r.returncode != 0
    assert "gated" in r.stderr and "HF_TOKEN" in r.stderr


def test_wrong_token(hub, tmp_path):
    r = pull(hub, tmp_path, "acme/private", "--token", "hf_wrong")
    assert r.returncode != 0
    assert "403" in r.stderr or "denied" in r.stderr


def test_not_found(hub, tmp_path):
    r = pull(hub, tmp_path, "acme/nope")
    assert r.returncode != 0 and "repository not found: acme/nope" in r.stderr
    r = pull(hub, tmp_path, "--revision", "no-such-branch")
    assert r.returncode != 0 and "revision not found" in r.stderr


def test_revision_by_commit_and_offline(hub, tmp_path):
    commit = hub.repos[REPO_ID].commit
    r = pull(hub, tmp_path, "--revision", commit, "--include", "config.json")
    assert r.returncode == 0, r.stderr
    assert not any("/revision/" in q["path"] for q in hub.requests("hub"))
    assert not (cache_repo(tmp_path) / "refs" / "main").exists()
    assert pull(hub, tmp_path, "--include", "config.json").returncode == 0
    n = len(hub.log)
    r = pull(hub, tmp_path, env=env_for(hub, tmp_path, HF_HUB_OFFLINE="1"))
    assert r.returncode == 0 and r.stdout.strip().endswith(commit)
    assert len(hub.log) == n


def test_hub_cache_env(hub, tmp_path):
    cache = tmp_path / "elsewhere"
    r = pull(hub, tmp_path, "--include", "README.md", env=env_for(hub, tmp_path, HF_HUB_CACHE=str(cache)))
    assert r.returncode == 0, r.stderr
    assert (cache / "models--acme--tiny-moe" / "snapshots" / hub.repos[REPO_ID].commit / "README.md").exists()


def test_progress_bars_on_a_terminal(hub, tmp_path):
    import pty
    master, slave = pty.openpty()
    hub.faults = {"slow": 1_000_000}
    p = subprocess.Popen([BIN, "pull", REPO_ID], env=env_for(hub, tmp_path), stdout=subprocess.PIPE,
                         stderr=slave)
    os.close(slave)
    out = b""
    while True:
        try:
            chunk = os.read(master, 65536)
        except OSError:
            break
        if not chunk:
            break
        out += chunk
    assert p.wait(timeout=60) == 0
    text = out.decode(errors="replace")
    assert "\x1b[" in text and "total (" in text and "ETA" in text and "/s" in text
    assert "00002.safetensors [" in text  # a bar for an active file
    assert "Fetched 10 files" in text


def test_missing_file_is_reported_and_the_rest_fetched(hub, tmp_path):
    hub.faults = {"missing": ["sub/notes.txt"]}
    r = pull(hub, tmp_path)
    assert r.returncode != 0
    assert "file not found" in r.stderr and "sub/notes.txt" in r.stderr and "404" in r.stderr
    hub.faults = {}
    r = pull(hub, tmp_path)  # the re-run fetches only what is missing
    assert r.returncode == 0 and "Fetched 1 file " in r.stderr, r.stderr
    check_cache(tmp_path, hub)


def test_expired_file_url_is_refreshed(hub, tmp_path):
    big = "model-00001-of-00002.safetensors"
    hub.faults = {"expire": {sha256(hub.repos[REPO_ID].files[big]): 1}}
    r = pull(hub, tmp_path, "--include", big)
    assert r.returncode == 0, r.stderr
    heads = [q for q in hub.requests("hub", "HEAD") if big in q["path"]]
    assert len(heads) == 2  # a second HEAD for a fresh signed URL
    check_cache(tmp_path, hub, [big])


def test_429_retry_after_is_honoured(hub, tmp_path):
    hub.faults = {"busy": {"/tree/": 1, "/lfs/": 1}}
    t0 = time.time()
    r = pull(hub, tmp_path, "--include", "*.json")
    assert r.returncode == 0, r.stderr
    assert time.time() - t0 >= 1.9 and "HTTP 429" in r.stderr
    check_cache(tmp_path, hub, ["config.json", "tokenizer.json"])


def test_renamed_repository_redirect(hub, tmp_path):
    hub.faults = {"aliases": {"acme/old-name": REPO_ID}}
    r = pull(hub, tmp_path, "acme/old-name", "--include", "*.json", env=env_for(hub, tmp_path, HF_TOKEN=TOKEN))
    assert r.returncode == 0, r.stderr
    snap = tmp_path / "hfhome/hub/models--acme--old-name/snapshots" / hub.repos[REPO_ID].commit
    assert (snap / "tokenizer.json").read_bytes() == hub.repos[REPO_ID].files["tokenizer.json"]
    assert all(q["auth"] == "Bearer " + TOKEN for q in hub.requests("hub"))  # same origin: token kept
    assert all(q["auth"] is None for q in hub.requests("file"))


def test_two_processes_share_the_cache(hub, tmp_path):
    hub.faults = {"slow": 500_000}
    env = env_for(hub, tmp_path)
    ps = [subprocess.Popen([BIN, "pull", REPO_ID, "--quiet"], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in ps]
    assert all(p.returncode == 0 for p in ps), outs
    check_cache(tmp_path, hub)
    repo = hub.repos[REPO_ID]
    got = [q["path"].split("/lfs/")[1].split("?")[0] for q in hub.requests("file", "GET")]
    assert sorted(got) == sorted({sha256(repo.files[p]) for p in repo.lfs})  # each blob fetched once


@pytest.mark.parametrize("variant", ["bare_listing", "no_tree"])
def test_listing_variants(hub, tmp_path, variant):
    hub.faults = {variant: True}
    r = pull(hub, tmp_path)
    assert r.returncode == 0, r.stderr
    check_cache(tmp_path, hub)
    name = "model-00001-of-00002.safetensors"  # sha256 still checked (from X-Linked-Etag)
    hub.faults = {variant: True, "corrupt": [sha256(hub.repos[REPO_ID].files[name])]}
    r = pull(hub, tmp_path, "--include", name, "--cache-dir", str(tmp_path / "other"))
    assert r.returncode != 0 and "checksum mismatch" in r.stderr


def test_resume_after_kill_local_dir(hub, tmp_path):
    repo = hub.repos[REPO_ID]
    name = "model-00002-of-00002.safetensors"
    out = tmp_path / "ld"
    hub.faults = {"slow": 200_000}
    p = subprocess.Popen([BIN, "pull", REPO_ID, "--include", name, "--local-dir", str(out)],
                         env=env_for(hub, tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    dl = out / ".cache/huggingface/download"
    deadline = time.time() + 30
    parts = []
    while time.time() < deadline:
        parts = list(dl.glob("*.incomplete")) if dl.exists() else []
        if parts and parts[0].stat().st_size > 300_000:
            break
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait()
    assert parts and not (out / name).exists()
    have = parts[0].stat().st_size
    hub.faults = {}
    n = len(hub.requests("file", "GET"))
    r = pull(hub, tmp_path, "--include", name, "--local-dir", str(out))
    assert r.returncode == 0, r.stderr
    assert hub.requests("file", "GET")[n]["range"] == "bytes=%d-" % have
    assert (out / name).read_bytes() == repo.files[name] and not list(dl.glob("*.incomplete"))


def test_persistent_server_errors_fail_in_bounded_time(hub, tmp_path):
    hub.faults = {"fail": {"/resolve/" + hub.repos[REPO_ID].commit + "/README.md": 1000}}
    t0 = time.time()
    r = pull(hub, tmp_path, "--max-retries", "2")
    assert r.returncode != 0 and time.time() - t0 < 20
    assert "README.md" in r.stderr and "giving up after 3 attempts" in r.stderr
    assert "Fetched 9 files" in r.stderr  # the others are in place; a re-run fetches the rest
