#include "tools/hub_cache.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <chrono>
#include <fmt/format.h>
#include <fstream>
#include <memory>
#include <sstream>
#include <vector>

#include "core/error.h"
#include "tools/hub_client.h"

namespace moeserve::hub {

CacheLayout cache_layout(const std::string& cache_dir, const std::string& repo_id, const std::string& repo_type) {
  const std::string name = repo_folder_name(repo_id, repo_type);
  return {fs::path(cache_dir) / name, fs::path(cache_dir) / ".locks" / name};
}

std::string snapshot_link_target(const std::string& path, const std::string& etag) {
  std::string t = "../../";
  for (char c : path)
    if (c == '/') t += "../";
  return t + "blobs/" + etag;
}

void write_file_atomic(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  const fs::path tmp = p.string() + fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    MS_CHECK(f.good(), "cannot write {}", tmp.string());
    f << text;
    MS_CHECK(f.good(), "cannot write {}", tmp.string());
  }
  fs::rename(tmp, p);
}

void make_snapshot_link(const CacheLayout& c, const std::string& commit, const std::string& path,
                        const std::string& etag) {
  const fs::path link = c.snapshot_file(commit, path);
  const std::string target = snapshot_link_target(path, etag);
  fs::create_directories(link.parent_path());
  check_inside(c.repo_dir, link.parent_path());
  std::error_code ec;
  if (fs::is_symlink(link, ec) && fs::read_symlink(link, ec).string() == target) return;
  const fs::path tmp = link.string() + fmt::format(".tmp{}", ::getpid());
  fs::remove(tmp, ec);
  fs::create_symlink(target, tmp);
  fs::rename(tmp, link);
}

void write_ref(const CacheLayout& c, const std::string& revision, const std::string& commit) {
  check_inside(c.repo_dir / "refs", c.ref(revision));
  write_file_atomic(c.ref(revision), commit);
}

std::optional<std::string> read_ref(const CacheLayout& c, const std::string& revision) {
  std::ifstream f(c.ref(revision));
  if (!f) return std::nullopt;
  std::string s;
  std::getline(f, s);
  while (!s.empty() && (s.back() == '\r' || s.back() == ' ')) s.pop_back();
  return s.empty() ? std::nullopt : std::optional<std::string>(s);
}

fs::path local_metadata_path(const fs::path& dir, const std::string& path) {
  return dir / ".cache" / "huggingface" / "download" / (path + ".metadata");
}

std::optional<LocalMetadata> read_local_metadata(const fs::path& dir, const std::string& path) {
  std::ifstream f(local_metadata_path(dir, path));
  if (!f) return std::nullopt;
  LocalMetadata m;
  std::string ts;
  if (!std::getline(f, m.commit) || !std::getline(f, m.etag) || !std::getline(f, ts)) return std::nullopt;
  m.timestamp = std::atof(ts.c_str());
  return m;
}

void write_local_metadata(const fs::path& dir, const std::string& path, const std::string& commit,
                          const std::string& etag) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  write_file_atomic(local_metadata_path(dir, path), fmt::format("{}\n{}\n{:.6f}\n", commit, etag, now));
}

void init_local_dir(const fs::path& dir) {
  const fs::path hf = dir / ".cache" / "huggingface";
  fs::create_directories(hf);
  if (!fs::exists(hf / ".gitignore")) write_file_atomic(hf / ".gitignore", "*");
  if (!fs::exists(hf / "CACHEDIR.TAG"))
    write_file_atomic(hf / "CACHEDIR.TAG",
                      "Signature: 8a477f597d28d172789f06886806bc55\n"
                      "# This file is a cache directory tag created by huggingface_hub.\n"
                      "# For information about cache directory tags, see:\n"
                      "#\thttps://bford.info/cachedir/\n");
}

void check_repo_path(const std::string& path) {
  MS_CHECK(!path.empty() && path[0] != '/' && path.find('\\') == std::string::npos &&
               path.find('\0') == std::string::npos,
           "unsafe file path in the repository listing: '{}'", path);
  std::stringstream ss(path);
  std::string part;
  while (std::getline(ss, part, '/'))
    MS_CHECK(!part.empty() && part != "." && part != "..", "unsafe file path in the repository listing: '{}'", path);
  MS_CHECK(path.back() != '/', "unsafe file path in the repository listing: '{}'", path);
}

void check_inside(const fs::path& root, const fs::path& p) {
  std::error_code ec;
  const fs::path r = fs::weakly_canonical(fs::absolute(root), ec);
  MS_CHECK(!ec, "cannot resolve {}: {}", root.string(), ec.message());
  const fs::path q = fs::weakly_canonical(fs::absolute(p), ec);
  MS_CHECK(!ec, "cannot resolve {}: {}", p.string(), ec.message());
  auto ri = r.begin(), qi = q.begin();
  for (; ri != r.end() && !ri->empty(); ++ri, ++qi)
    MS_CHECK(qi != q.end() && *qi == *ri, "refusing to write {}: it resolves to {}, outside {}", p.string(),
             q.string(), r.string());
}

namespace {
struct Md {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  explicit Md(const EVP_MD* md = EVP_sha256()) { EVP_DigestInit_ex(ctx, md, nullptr); }
  ~Md() { EVP_MD_CTX_free(ctx); }
  void update(const void* d, size_t n) { EVP_DigestUpdate(ctx, d, n); }
  std::string hex() {
    unsigned char out[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(ctx, out, &n);
    std::string s;
    for (unsigned i = 0; i < n; ++i) s += fmt::format("{:02x}", out[i]);
    return s;
  }
};
}  // namespace

std::string sha256_hex(const std::string& data) {
  Md md;
  md.update(data.data(), data.size());
  return md.hex();
}

bool git_etag_matches(const fs::path& p, const std::string& etag) {
  std::error_code ec;
  const auto size = fs::file_size(p, ec);
  if (ec) return false;
  std::ifstream f(p, std::ios::binary);
  if (!f) return false;
  Md git(EVP_sha1()), plain(EVP_sha1());
  const std::string head = fmt::format("blob {}", size);
  git.update(head.data(), head.size() + 1);  // with the terminating NUL
  std::vector<char> buf(size_t(1) << 20);
  while (f) {
    f.read(buf.data(), std::streamsize(buf.size()));
    const auto n = size_t(f.gcount());
    git.update(buf.data(), n);
    plain.update(buf.data(), n);
  }
  return git.hex() == etag || plain.hex() == etag;
}

std::string sha256_file(const fs::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY | O_CLOEXEC);
  MS_CHECK(fd >= 0, "cannot open {} to hash it", p.string());
  Md md;
  std::vector<char> buf(size_t(4) << 20);
  while (true) {
    const ssize_t n = ::read(fd, buf.data(), buf.size());
    if (n < 0) {
      ::close(fd);
      fail("read error hashing {}", p.string());
    }
    if (n == 0) break;
    md.update(buf.data(), size_t(n));
  }
  ::close(fd);
  return md.hex();
}

}  // namespace moeserve::hub
