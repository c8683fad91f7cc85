"""A stand-in for the Hugging Face hub on loopback, for testing `moeserve pull`.

Two HTTP/1.1 servers: the hub (API + resolve endpoints) and a file host that the hub
redirects LFS files to (a second port, so a different origin: Authorization must not
reach it). Follows the protocol in shared/reference/hf-hub.md:

  GET  /api/models/{repo}/revision/{rev}[?blobs=true]   -> {"id","sha","siblings":[...]}
  GET  /api/models/{repo}/tree/{rev}?recursive=true      -> [{"type","oid","size","path","lfs"?}], Link pagination
  HEAD/GET /{repo}/resolve/{rev}/{path}                  -> 200 (git file) or 302 to the file host (LFS file),
        with X-Repo-Commit, ETag / X-Linked-Etag, X-Linked-Size; X-Error-Code on 4xx
  GET  {filehost}/lfs/{sha256}?sig=...                   -> bytes, with Range (206) support

Faults are set on `FakeHub.faults` (in-process) or as JSON via --faults (CLI):
  fail:         {substring: N}   the first N requests whose path contains substring answer 500
  drop:         {substring: N}   the file host closes the connection after N bytes (once per key)
  drop_times:   int              how many times each drop fires (default 1)
  corrupt:      [substring]      the file host flips a byte of matching files
  slow:         bytes/s          file-host throttle
  stall:        {substring: N}   the file host stops sending for stall_s seconds (default 30) after N bytes, once
  ignore_range: bool             the file host answers 200 with the whole file to Range requests
  busy:         {substring: N}   the first N matching requests answer 429 with Retry-After: 1
  expire:       {substring: N}   the file host answers 403 (expired signed URL) to the first N matching GETs
  missing:      [path]           the resolve endpoint answers 404 EntryNotFound for these files
  aliases:      {old_id: new_id} a renamed repository: requests for old_id get a 307 to new_id
  bare_listing: bool             tree entries without "lfs" (the sha256 then comes from X-Linked-Etag)
  no_tree:      bool             no tree endpoint (404): clients fall back to the revision's siblings
  headers:      {substring: {name: value}}  hostile resolve headers (value None removes the header)
  listing:      {path: {field: value}}      hostile tree / siblings entry fields (None removes the field)
  revision_sha: str              the revision endpoint's "sha"
Every request is appended to `FakeHub.log`: dicts with server, method, path, range, auth.
"""
import argparse
import hashlib
import json
import os
import socket
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def git_blob_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


class Repo:
    def __init__(self, files, lfs_threshold=1024, gated=False, private=False):
        # files: {path: bytes}
        self.files = dict(sorted(files.items()))
        self.lfs = {p for p, d in self.files.items() if len(d) >= lfs_threshold or p.endswith(".safetensors")}
        h = hashlib.sha1()
        for p, d in self.files.items():
            h.update(p.encode() + b"\0" + hashlib.sha256(d).digest())
        self.commit = h.hexdigest()
        self.branches = {"main": self.commit}
        self.gated = gated
        self.private = private

    def entry(self, path):
        d = self.files[path]
        e = {"type": "file", "oid": git_blob_sha1(d), "size": len(d), "path": path}
        if path in self.lfs:
            e["lfs"] = {"oid": hashlib.sha256(d).hexdigest(), "size": len(d), "pointerSize": 134}
        return e


class FakeHub:
    def __init__(self, repos, tokens=(), page_size=2, file_host="127.0.0.1"):
        self.repos = repos  # {repo_id: Repo}
        self.tokens = set(tokens)
        self.page_size = page_size
        self.faults = {}
        self.log = []
        self.lock = threading.Lock()
        self.blobs = {}
        for r in repos.values():
            for p in r.lfs:
                self.blobs[hashlib.sha256(r.files[p]).hexdigest()] = r.files[p]
        self._counters = {}
        self.active = 0           # file-host bodies being sent now
        self.max_active = 0       # the most at once: parallelism seen by the server
        self.hub = self._server(HubHandler)
        self.files = self._server(FileHandler)
        self.endpoint = "http://127.0.0.1:%d" % self.hub.server_address[1]
        # Same host, another port by default (another origin); huggingface_hub >= 1.30 compares
        # host names only, so its own oracle runs use file_host="localhost".
        self.file_origin = "http://%s:%d" % (file_host, self.files.server_address[1])

    def _server(self, handler):
        srv = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        srv.daemon_threads = True
        srv.hub = self
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def close(self):
        for s in (self.hub, self.files):
            s.shutdown()
            s.server_close()

    def count(self, kind, key):
        """Returns how many times (kind, key) fired before, and records one more."""
        with self.lock:
            n = self._counters.get((kind, key), 0)
            self._counters[(kind, key)] = n + 1
            return n

    def fault_hit(self, kind, path):
        spec = self.faults.get(kind) or {}
        for sub, n in spec.items():
            if sub in path and self.count(kind, sub) < n:
                return n
        return None

    def requests(self, server=None, method=None):
        with self.lock:
            return [r for r in self.log if (server is None or r["server"] == server)
                    and (method is None or r["method"] == method)]


class Base(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_name_ = "?"

    def log_message(self, *a):
        pass

    @property
    def hub(self):
        return self.server.hub

    def record(self):
        with self.hub.lock:
            self.hub.log.append({"server": self.server_name_, "method": self.command, "path": self.path,
                                 "range": self.headers.get("Range"), "auth": self.headers.get("Authorization")})

    def send(self, status, body=b"", headers=None, ctype="application/json"):
        self.send_response(status)
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def error(self, status, code, msg):
        self.send(status, json.dumps({"error": msg}).encode(), {"X-Error-Code": code, "X-Error-Message": msg})

    def maybe_fail(self):
        if self.hub.fault_hit("fail", self.path):
            self.send(500, b'{"error":"injected"}')
            return True
        if self.hub.fault_hit("busy", self.path):
            self.send(429, b'{"error":"slow down"}', {"Retry-After": "1"})
            return True
        for old, new in (self.hub.faults.get("aliases") or {}).items():
            for prefix in ("/api/models/", "/"):
                if self.path.startswith(prefix + old + "/"):
                    self.send(307, b"", {"Location": prefix + new + self.path[len(prefix + old):]})
                    return True
        return False

    def send_bytes(self, data, extra):
        """Body with Range support and the file-host faults."""
        f = self.hub.faults
        rng = self.headers.get("Range")
        start, end, status = 0, len(data) - 1, 200
        if rng and not f.get("ignore_range"):
            spec = rng.split("=", 1)[1]
            a, b = spec.split("-", 1)
            start = int(a)
            end = int(b) if b else len(data) - 1
            end = min(end, len(data) - 1)
            if start >= len(data):
                self.send(416, b"", {"Content-Range": "bytes */%d" % len(data)})
                return
            status = 206
        body = data[start:end + 1]
        self.send_response(status)
        for k, v in extra.items():
            self.send_header(k, v)
        if status == 206:
            self.send_header("Content-Range", "bytes %d-%d/%d" % (start, end, len(data)))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Content-Type", "application/octet-stream")
        self.end_headers()
        if self.command == "HEAD":
            return
        drop_at = None
        for sub in (f.get("drop") or {}):
            if sub in self.path and self.hub.count("drop", sub) < f.get("drop_times", 1):
                drop_at = f["drop"][sub]
        if any(sub in self.path for sub in f.get("corrupt", [])) and body:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        stall_at = None
        for sub in (f.get("stall") or {}):
            if sub in self.path and self.hub.count("stall", sub) < 1:
                stall_at = f["stall"][sub]
        rate = f.get("slow")
        step = 16384 if not rate else max(1, min(16384, int(rate / 10)))
        sent = 0
        with self.hub.lock:
            self.hub.active += 1
            self.hub.max_active = max(self.hub.max_active, self.hub.active)
        try:
            while sent < len(body):
                n = min(step, len(body) - sent)
                if drop_at is not None and sent + n > drop_at:
                    self.wfile.write(body[sent:drop_at])
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                if stall_at is not None and sent + n > stall_at:
                    self.wfile.write(body[sent:stall_at])
                    self.wfile.flush()
                    sent = stall_at
                    stall_at = None
                    time.sleep(f.get("stall_s", 30))
                    continue
                self.wfile.write(body[sent:sent + n])
                sent += n
                if rate:
                    self.wfile.flush()
                    time.sleep(n / rate)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            with self.hub.lock:
                self.hub.active -= 1


class HubHandler(Base):
    server_name_ = "hub"

    def auth_ok(self, repo):
        tok = (self.headers.get("Authorization") or "").removeprefix("Bearer ").strip()
        if not (repo.gated or repo.private):
            return True
        if not tok:
            if repo.gated:
                self.error(401, "GatedRepo", "Access to this repo is restricted; you must be authenticated.")
            else:
                self.error(401, "RepoNotFound", "Repository not found")
            return False
        if tok not in self.hub.tokens:
            self.error(403, "GatedRepo" if repo.gated else "", "Invalid credentials or no access")
            return False
        return True

    def find(self, parts):
        """Longest repo id that prefixes `parts`: (repo_id, repo, rest)."""
        for n in (2, 1):
            rid = "/".join(parts[:n])
            if rid in self.hub.repos:
                return rid, self.hub.repos[rid], parts[n:]
        return None, None, None

    def commit_of(self, repo, rev):
        rev = urllib.parse.unquote(rev)
        if rev in repo.branches:
            return repo.branches[rev]
        if rev == repo.commit:
            return rev
        return None

    def do_GET(self):
        self.record()
        if self.maybe_fail():
            return
        url = urllib.parse.urlsplit(self.path)
        q = urllib.parse.parse_qs(url.query)
        parts = url.path.strip("/").split("/")
        if parts[:2] == ["api", "models"]:
            return self.api(parts[2:], q)
        return self.resolve(parts)

    do_HEAD = do_GET

    def api(self, parts, q):
        # {org}/{name}/revision/{rev} or {org}/{name}/tree/{rev}[/path]
        rid, repo, rest = None, None, None
        for i, p in enumerate(parts):
            if p in ("revision", "tree") and i >= 1:
                rid = "/".join(parts[:i])
                rest = parts[i:]
                break
        repo = self.hub.repos.get(rid)
        if repo is None:
            return self.error(401 if not self.headers.get("Authorization") else 404, "RepoNotFound",
                              "Repository not found")
        if not self.auth_ok(repo):
            return
        if len(rest) < 2:
            return self.error(404, "", "bad path")
        commit = self.commit_of(repo, rest[1])
        if commit is None:
            return self.error(404, "RevisionNotFound", "Invalid rev id: %s" % urllib.parse.unquote(rest[1]))
        if rest[0] == "revision":
            sib = []
            for p in repo.files:
                s = {"rfilename": p}
                if q.get("blobs") == ["true"]:
                    e = repo.entry(p)
                    s.update({"size": e["size"], "blobId": e["oid"]})
                    if "lfs" in e:
                        s["lfs"] = {"sha256": e["lfs"]["oid"], "size": e["size"], "pointerSize": 134}
                sib.append(s)
            for si in sib:
                for k, v in (self.hub.faults.get("listing") or {}).get(si["rfilename"], {}).items():
                    si.pop(k, None) if v is None else si.__setitem__(k, v)
            body = {"_id": "x", "id": rid, "modelId": rid, "sha": self.hub.faults.get("revision_sha", commit), "private": repo.private,
                    "gated": repo.gated, "siblings": sib}
            return self.send(200, json.dumps(body).encode())
        if self.hub.faults.get("no_tree"):
            return self.send(404, b"Not Found", ctype="text/plain")
        entries = [repo.entry(p) for p in repo.files]
        if self.hub.faults.get("bare_listing"):
            for e in entries:
                e.pop("lfs", None)
        for e in entries:
            for k, v in (self.hub.faults.get("listing") or {}).get(e["path"], {}).items():
                e.pop(k, None) if v is None else e.__setitem__(k, v)
        dirs = sorted({"/".join(p.split("/")[:i]) for p in repo.files for i in range(1, p.count("/") + 1)})
        entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": d} for d in dirs]
        cursor = int(q.get("cursor", ["0"])[0])
        page = entries[cursor:cursor + self.hub.page_size]
        headers = {}
        if cursor + self.hub.page_size < len(entries):
            nxt = "%s/api/models/%s/tree/%s?recursive=true&expand=false&cursor=%d" % (
                self.hub.endpoint, rid, rest[1], cursor + self.hub.page_size)
            headers["Link"] = '<%s>; rel="next"' % nxt
        self.send(200, json.dumps(page).encode(), headers)

    def resolve(self, parts):
        rid, repo, rest = self.find(parts)
        if repo is None:
            return self.error(401 if not self.headers.get("Authorization") else 404, "RepoNotFound",
                              "Repository not found")
        if not self.auth_ok(repo):
            return
        if len(rest) < 3 or rest[0] != "resolve":
            return self.error(404, "", "bad path")
        commit = self.commit_of(repo, rest[1])
        if commit is None:
            return self.error(404, "RevisionNotFound", "Invalid rev id")
        path = urllib.parse.unquote("/".join(rest[2:]))
        if path not in repo.files or path in self.hub.faults.get("missing", []):
            return self.error(404, "EntryNotFound", "%s does not exist on %s" % (path, rest[1]))
        data = repo.files[path]
        e = repo.entry(path)
        h = {"X-Repo-Commit": commit, "ETag": '"%s"' % e["oid"]}
        lfs = path in repo.lfs
        if lfs:
            sha = e["lfs"]["oid"]
            h.update({"X-Linked-Etag": '"%s"' % sha, "X-Linked-Size": str(len(data)),
                      "Location": "%s/lfs/%s?sig=%s" % (self.hub.file_origin, sha, sha[:8])})
        for sub, hostile in (self.hub.faults.get("headers") or {}).items():
            if sub in self.path:
                for k, v in hostile.items():
                    h.pop(k, None) if v is None else h.__setitem__(k, v)
        if lfs or "Location" in h:
            return self.send(302, b"", h)
        self.send_bytes(data, h)


class FileHandler(Base):
    server_name_ = "file"

    def do_GET(self):
        self.record()
        if self.maybe_fail():
            return
        url = urllib.parse.urlsplit(self.path)
        sha = url.path.rsplit("/", 1)[-1]
        data = self.hub.blobs.get(sha)
        if data is None or not url.query.startswith("sig=") or \
                (self.command == "GET" and self.hub.fault_hit("expire", self.path)):
            return self.send(403, b"<Error>AccessDenied</Error>", ctype="application/xml")
        self.send_bytes(data, {"ETag": '"%s"' % sha})

    do_HEAD = do_GET


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repo", action="append", default=[], help="org/name=DIR (files under DIR)")
    ap.add_argument("--gated", action="append", default=[], help="repo id that needs a token")
    ap.add_argument("--token", action="append", default=[], help="accepted token")
    ap.add_argument("--faults", default=os.environ.get("FAKE_HUB_FAULTS", "{}"), help="JSON faults (see above)")
    ap.add_argument("--page-size", type=int, default=50)
    args = ap.parse_args()
    repos = {}
    for spec in args.repo:
        rid, d = spec.split("=", 1)
        files = {}
        for root, _, names in os.walk(d):
            for n in names:
                full = os.path.join(root, n)
                files[os.path.relpath(full, d).replace(os.sep, "/")] = open(full, "rb").read()
        repos[rid] = Repo(files, gated=rid in args.gated)
    hub = FakeHub(repos, args.token, args.page_size)
    hub.faults = json.loads(args.faults)
    print("HF_ENDPOINT=%s file-host=%s" % (hub.endpoint, hub.file_origin), flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        hub.close()


if __name__ == "__main__":
    main()
