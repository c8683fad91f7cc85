// On-disk layouts `moeserve pull` writes, exactly as huggingface_hub reads them
// (shared/reference/hf-hub.md §8):
//   cache:     {cache}/models--org--name/{blobs/<etag>, refs/<rev>, snapshots/<commit>/<path> -> ../../blobs/<etag>}
//              plus {cache}/.locks/models--org--name/<etag>.lock
//   local dir: {dir}/<path> real files, {dir}/.cache/huggingface/download/<path>.metadata
//              (three lines: commit, etag, timestamp), .gitignore and CACHEDIR.TAG.
#pragma once
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

namespace moeserve::hub {

namespace fs = std::filesystem;

struct CacheLayout {
  fs::path repo_dir;  // {cache}/models--org--name
  fs::path locks_dir;  // {cache}/.locks/models--org--name
  fs::path blob(const std::string& etag) const { return repo_dir / "blobs" / etag; }
  fs::path ref(const std::string& revision) const { return repo_dir / "refs" / revision; }
  fs::path snapshot_dir(const std::string& commit) const { return repo_dir / "snapshots" / commit; }
  fs::path snapshot_file(const std::string& commit, const std::string& path) const {
    return snapshot_dir(commit) / path;
  }
  fs::path lock(const std::string& etag) const { return locks_dir / (etag + ".lock"); }
};
CacheLayout cache_layout(const std::string& cache_dir, const std::string& repo_id, const std::string& repo_type);

// The relative target of snapshots/<commit>/<path>: "../../blobs/<etag>" with one more
// "../" per directory in `path`.
std::string snapshot_link_target(const std::string& path, const std::string& etag);
// Creates or replaces the snapshot symlink atomically (symlink to a temp name, rename).
void make_snapshot_link(const CacheLayout& c, const std::string& commit, const std::string& path,
                        const std::string& etag);
// refs/<revision> holds the commit, no newline; written atomically.
void write_ref(const CacheLayout& c, const std::string& revision, const std::string& commit);
std::optional<std::string> read_ref(const CacheLayout& c, const std::string& revision);

struct LocalMetadata {
  std::string commit, etag;
  double timestamp = 0;
};
fs::path local_metadata_path(const fs::path& dir, const std::string& path);
std::optional<LocalMetadata> read_local_metadata(const fs::path& dir, const std::string& path);
void write_local_metadata(const fs::path& dir, const std::string& path, const std::string& commit,
                          const std::string& etag);
// Creates {dir}/.cache/huggingface with its .gitignore ("*") and CACHEDIR.TAG.
void init_local_dir(const fs::path& dir);

// A repository path must stay inside the output folder: relative, no "..", no empty parts.
void check_repo_path(const std::string& path);

// Throws unless `p`, with symlinks of its existing parts resolved and "." / ".." removed,
// lies inside `root` (resolved the same way): no created path may leave the target folder.
void check_inside(const fs::path& root, const fs::path& p);

// Lower-case hex sha256 of a file's contents (OpenSSL EVP).
std::string sha256_file(const fs::path& p);
std::string sha256_hex(const std::string& data);
// Whether a git-stored file matches its ETag: the git blob sha1 (sha1 of "blob <len>\0" +
// content, what the hub sends) or, from mirrors that hash plainly, the sha1 of the content.
bool git_etag_matches(const fs::path& p, const std::string& etag);

// Writes `text` to `p` through a temp file and rename.
void write_file_atomic(const fs::path& p, const std::string& text);

}  // namespace moeserve::hub
