// Single-file safetensors: mmap + header validation, and the writer.
//
// File layout: [u64 LE header length N][N bytes of JSON header][data section].
// The header is an object: "__metadata__" -> {string: string} (optional) and
// tensor name -> {"dtype": "F32", "shape": [d0, ...], "data_offsets": [begin, end]}, offsets
// relative to the data section.
//
// Validation follows the reference Rust implementation: sorted by offset, the tensors must
// tile the data section exactly (each begins where the previous ended, the last ends at EOF),
// so there are no holes, no overlaps and no trailing bytes; end - begin == numel * dtype size
// (computed with overflow checks). Everything is checked in open(), so get() can never read
// outside the mapping.
#include "io/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/bounded_json.h"

namespace moeserve {
namespace {

// Same limit as the reference implementation: a header above 100 MB is treated as corrupt.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// A non-negative JSON integer that fits int64 (dims) / uint64 (offsets).
bool json_to_u64(const nlohmann::json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = uint64_t(v.get<int64_t>());
    return true;
  }
  return false;
}

// Parses and validates one tensor entry (offsets are checked against the file in check_layout).
TensorInfo parse_entry(const std::string& path, const std::string& name, const nlohmann::json& e) {
  MS_CHECK(e.is_object(), "{}: tensor '{}': header entry is not an object", path, name);
  auto dt = e.find("dtype");
  auto sh = e.find("shape");
  auto off = e.find("data_offsets");
  MS_CHECK(dt != e.end(), "{}: tensor '{}': missing 'dtype'", path, name);
  MS_CHECK(sh != e.end(), "{}: tensor '{}': missing 'shape'", path, name);
  MS_CHECK(off != e.end(), "{}: tensor '{}': missing 'data_offsets'", path, name);
  MS_CHECK(dt->is_string(), "{}: tensor '{}': 'dtype' is not a string", path, name);

  TensorInfo info;
  info.name = name;
  info.file = path;
  const std::string& dts = dt->get_ref<const std::string&>();
  MS_CHECK(parse_dtype(dts, &info.dtype),
           "{}: tensor '{}': unsupported dtype '{}' (supported: F32, F16, BF16, F8_E4M3, I32, "
           "I64, U8, BOOL)",
           path, name, dts);

  MS_CHECK(sh->is_array(), "{}: tensor '{}': 'shape' is not an array", path, name);
  uint64_t numel = 1;
  for (const auto& d : *sh) {
    MS_CHECK(d.is_number_integer(), "{}: tensor '{}': shape {} has a non-integer dimension", path,
             name, sh->dump());
    uint64_t dim = 0;
    MS_CHECK(json_to_u64(d, &dim), "{}: tensor '{}': shape {} has a negative dimension", path, name,
             sh->dump());
    MS_CHECK(dim <= uint64_t(std::numeric_limits<int64_t>::max()),
             "{}: tensor '{}': shape {} dimension too large", path, name, sh->dump());
    MS_CHECK(!__builtin_mul_overflow(numel, dim, &numel),
             "{}: tensor '{}': shape {} element count overflows", path, name, sh->dump());
    info.shape.push_back(int64_t(dim));
  }
  uint64_t nbytes = 0;
  MS_CHECK(!__builtin_mul_overflow(numel, uint64_t(dtype_size(info.dtype)), &nbytes) &&
               numel <= uint64_t(std::numeric_limits<int64_t>::max()),
           "{}: tensor '{}': shape {} byte size overflows", path, name, sh->dump());

  MS_CHECK(off->is_array() && off->size() == 2,
           "{}: tensor '{}': 'data_offsets' must be an array [begin, end]", path, name);
  MS_CHECK(json_to_u64((*off)[0], &info.offset_begin) && json_to_u64((*off)[1], &info.offset_end),
           "{}: tensor '{}': 'data_offsets' {} must be non-negative integers", path, name,
           off->dump());
  MS_CHECK(info.offset_begin <= info.offset_end, "{}: tensor '{}': data_offsets {} has begin > end",
           path, name, off->dump());
  MS_CHECK(info.offset_end - info.offset_begin == nbytes,
           "{}: tensor '{}': dtype {} shape {} needs {} bytes but data_offsets {} span {} bytes",
           path, name, dts, shape_str(info.shape), nbytes, off->dump(),
           info.offset_end - info.offset_begin);
  return info;
}

// Checks that the tensors tile [0, data_size) exactly.
void check_layout(const std::string& path, const std::map<std::string, TensorInfo>& tensors,
                  uint64_t data_size) {
  std::vector<const TensorInfo*> order;
  order.reserve(tensors.size());
  for (const auto& [_, t] : tensors) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return std::pair(a->offset_begin, a->offset_end) < std::pair(b->offset_begin, b->offset_end);
  });
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo* t : order) {
    MS_CHECK(t->offset_end <= data_size,
             "{}: tensor '{}': data_offsets [{}, {}] end past the data section ({} bytes; file "
             "truncated?)",
             path, t->name, t->offset_begin, t->offset_end, data_size);
    if (t->offset_begin < pos) {
      fail("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", path, t->name,
           t->offset_begin, t->offset_end, prev->name, prev->offset_begin, prev->offset_end);
    }
    MS_CHECK(t->offset_begin == pos,
             "{}: tensor '{}': data_offsets [{}, {}] leave a gap of {} bytes after offset {} "
             "(tensors must be contiguous)",
             path, t->name, t->offset_begin, t->offset_end, t->offset_begin - pos, pos);
    pos = t->offset_end;
    prev = t;
  }
  MS_CHECK(pos == data_size,
           "{}: tensors cover {} bytes but the data section has {} (trailing bytes after tensor "
           "'{}')",
           path, pos, data_size, prev ? prev->name : std::string("<none>"));
}

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::shared_ptr<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  std::shared_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = path;
  f->self_ = f;

  Fd fd{::open(path.c_str(), O_RDONLY | O_CLOEXEC)};
  MS_CHECK(fd.fd >= 0, "{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  MS_CHECK(::fstat(fd.fd, &st) == 0, "{}: cannot stat: {}", path, std::strerror(errno));
  MS_CHECK(S_ISREG(st.st_mode), "{}: not a regular file", path);
  uint64_t size = uint64_t(st.st_size);
  MS_CHECK(size >= 8, "{}: file is {} bytes, shorter than the 8-byte header length (truncated?)",
           path, size);

  void* m = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd.fd, 0);
  MS_CHECK(m != MAP_FAILED, "{}: mmap of {} bytes failed: {}", path, size, std::strerror(errno));
  f->map_ = m;  // owned from here on: the destructor unmaps even if validation throws
  f->map_size_ = size;
  const uint8_t* base = static_cast<const uint8_t*>(m);

  uint64_t n = read_u64_le(base);
  MS_CHECK(n <= kMaxHeaderBytes, "{}: header length {} is larger than {} bytes (corrupt file?)",
           path, n, kMaxHeaderBytes);
  MS_CHECK(n <= size - 8,
           "{}: header length {} runs past the end of the file ({} bytes; truncated?)", path, n,
           size);

  const char* hbegin = reinterpret_cast<const char*>(base + 8);
  const std::string_view header_text(hbegin, n);
  MS_CHECK(json_nesting_depth(header_text, json_depth_limit()) <= json_depth_limit(),
           "{}: header JSON nested deeper than {} levels (the nesting limit)", path, json_depth_limit());
  nlohmann::json header = parse_json_bounded_or_discarded(header_text);
  MS_CHECK(!header.is_discarded(), "{}: header ({} bytes) is not valid JSON", path, n);
  MS_CHECK(header.is_object(), "{}: header is JSON but not an object", path);

  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      MS_CHECK(it->is_object(), "{}: '__metadata__' is not an object", path);
      for (auto m2 = it->begin(); m2 != it->end(); ++m2) {
        MS_CHECK(m2->is_string(), "{}: '__metadata__' value for '{}' is not a string", path,
                 m2.key());
        f->metadata_[m2.key()] = m2->get<std::string>();
      }
      continue;
    }
    f->tensors_.emplace(it.key(), parse_entry(path, it.key(), *it));
  }
  f->data_ = base + 8 + n;
  check_layout(path, f->tensors_, size - 8 - n);
  return f;
}

SafetensorsFile::~SafetensorsFile() {
  if (map_) ::munmap(map_, map_size_);
}

Tensor SafetensorsFile::get(const std::string& name) const {
  auto it = tensors_.find(name);
  MS_CHECK(it != tensors_.end(), "{}: no tensor named '{}'", path_, name);
  const TensorInfo& info = it->second;
  // The mapping is read-only: writing through this pointer faults. Callers copy first.
  Tensor t = Tensor::view(const_cast<uint8_t*>(data_ + info.offset_begin), info.dtype, info.shape);
  // Aliasing constructor: the view shares ownership of this file (and so of the mapping).
  t.owner = std::shared_ptr<void>(self_.lock(), t.data);
  MS_CHECK(t.owner, "{}: tensor '{}' requested from a file that is being destroyed", path_, name);
  return t;
}

void write_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  // ordered_json keeps "__metadata__" first and tensors in the order written.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    header["__metadata__"] = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) header["__metadata__"][k] = v;
  }
  std::set<std::string> seen;
  uint64_t offset = 0;
  for (const NamedTensor& nt : tensors) {
    const Tensor& t = nt.tensor;
    MS_CHECK(nt.name != "__metadata__", "{}: '__metadata__' is not a valid tensor name", path);
    MS_CHECK(seen.insert(nt.name).second, "{}: tensor '{}' given twice", path, nt.name);
    MS_CHECK(t.device == Device::CPU, "{}: tensor '{}' is not on the host", path, nt.name);
    for (int64_t d : t.shape) {
      MS_CHECK(d >= 0, "{}: tensor '{}' has negative shape {}", path, nt.name, shape_str(t.shape));
    }
    MS_CHECK(t.data || t.nbytes() == 0, "{}: tensor '{}' has no data", path, nt.name);
    uint64_t nb = t.nbytes();
    header[nt.name] = {{"dtype", std::string(dtype_name(t.dtype))},
                       {"shape", t.shape},
                       {"data_offsets", {offset, offset + nb}}};
    offset += nb;
  }
  std::string h = header.dump();
  // Pad with spaces so the data section starts 8-byte aligned (as the reference writer does).
  h.append((8 - h.size() % 8) % 8, ' ');

  // Write to a temporary name and rename, so a crash never leaves a half-written file that
  // looks like a checkpoint.
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    MS_CHECK(out.good(), "{}: cannot open for writing: {}", tmp, std::strerror(errno));
    uint8_t len[8];
    uint64_t n = h.size();
    for (int i = 0; i < 8; ++i) len[i] = uint8_t(n >> (8 * i));
    out.write(reinterpret_cast<const char*>(len), 8);
    out.write(h.data(), std::streamsize(h.size()));
    for (const NamedTensor& nt : tensors) {
      if (nt.tensor.nbytes()) {
        out.write(static_cast<const char*>(nt.tensor.data), std::streamsize(nt.tensor.nbytes()));
      }
    }
    out.flush();
    MS_CHECK(out.good(), "{}: write failed: {}", tmp, std::strerror(errno));
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  MS_CHECK(!ec, "{}: cannot rename from {}: {}", path, tmp, ec.message());
}

}  // namespace moeserve
